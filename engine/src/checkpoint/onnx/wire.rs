//! The protobuf wire format: varints, fixed-width values and length-delimited fields, checked at every step.

#[derive(Debug, PartialEq, Eq)]
pub struct WireError(pub String);

/// One field's payload, by wire type.
#[derive(Debug, PartialEq)]
pub enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl Field<'_> {
    /// Appends a repeated integer field, packed or not.
    pub fn push_ints(self, out: &mut Vec<i64>) -> Result<(), WireError> {
        match self {
            Field::Varint(v) => out.push(v as i64),
            Field::Bytes(b) => {
                let mut r = Reader::new(b);
                while !r.is_done() {
                    out.push(r.varint()? as i64);
                }
            }
            other => return Err(WireError(format!("expected integers, found {other:?}"))),
        }
        Ok(())
    }

    /// Appends a repeated float field, packed or not.
    pub fn push_floats(self, out: &mut Vec<f32>) -> Result<(), WireError> {
        match self {
            Field::Fixed32(v) => out.push(f32::from_bits(v)),
            Field::Bytes(b) if b.len() % 4 == 0 => {
                out.extend(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            }
            Field::Bytes(b) => return Err(WireError(format!("packed floats of {} bytes", b.len()))),
            other => return Err(WireError(format!("expected floats, found {other:?}"))),
        }
        Ok(())
    }
}

pub fn string(bytes: &[u8]) -> Result<String, WireError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| WireError("a string field is not UTF-8".into()))
}

pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    pub fn is_done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end =
            end.ok_or_else(|| WireError(format!("a field of {n} bytes runs past the end at byte {}", self.at)))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub fn varint(&mut self) -> Result<u64, WireError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.take(1)?.first().expect("one byte");
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError(format!("a varint longer than 10 bytes at byte {}", self.at)))
    }

    /// The next field number and payload, or `None` at the end.
    pub fn next_field(&mut self) -> Result<Option<(u64, Field<'a>)>, WireError> {
        if self.is_done() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (number, wire_type) = (key >> 3, key & 7);
        let field = match wire_type {
            0 => Field::Varint(self.varint()?),
            1 => Field::Fixed64(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"))),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| WireError("a length past usize".into()))?;
                Field::Bytes(self.take(len)?)
            }
            5 => Field::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"))),
            other => return Err(WireError(format!("wire type {other} of field {number} is not supported"))),
        };
        Ok(Some((number, field)))
    }
}
