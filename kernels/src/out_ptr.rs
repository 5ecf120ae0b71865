//! A shared output pointer for parallel tasks that each write their own elements of one buffer.

#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: every user's tasks write disjoint sets of elements.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Taking `self` whole keeps closures capturing the Send wrapper rather than its raw field.
    pub(crate) fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}
