//! The Llama family's forward pass, written once: each backend supplies the steps, this is their order.

/// Which RMSNorm of a layer a step applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerNorm {
    Input,
    PostAttention,
}

/// One backend's steps of a forward pass over a round's rows. A backend may fuse neighbouring steps (a norm
/// into the matmul that reads it, say) as long as each row's result stays what the steps say.
pub trait LlamaSteps {
    type Error;
    /// The residual stream x: the embedding rows of the round's tokens.
    fn embed(&mut self) -> Result<(), Self::Error>;
    /// normed = rms_norm(x) with layer `li`'s norm `which`.
    fn norm(&mut self, li: usize, which: LayerNorm) -> Result<(), Self::Error>;
    /// qkv = normed Wqkv (+ bias).
    fn qkv(&mut self, li: usize) -> Result<(), Self::Error>;
    /// Per row: q and k normed per head (Qwen3), RoPE at the row's position, k and v written to the KV cache.
    fn rope_store(&mut self, li: usize) -> Result<(), Self::Error>;
    /// attn = attention of each row's q over its lane's cached keys and values up to its position.
    fn attend(&mut self, li: usize) -> Result<(), Self::Error>;
    /// delta = attn Wo (+ bias).
    fn o_proj(&mut self, li: usize) -> Result<(), Self::Error>;
    /// act = silu(normed Wgate) * normed Wup.
    fn gate_up(&mut self, li: usize) -> Result<(), Self::Error>;
    /// delta = act Wdown.
    fn down(&mut self, li: usize) -> Result<(), Self::Error>;
    /// delta = layer `li`'s MLP of normed: the dense gated MLP, or a mixture of experts where the backend has one.
    fn mlp(&mut self, li: usize) -> Result<(), Self::Error> {
        self.gate_up(li)?;
        self.down(li)
    }
    /// Whether layer `li` mixes positions by linear attention rather than attention.
    fn is_linear(&self, _li: usize) -> bool {
        false
    }
    /// delta = layer `li`'s linear attention of normed, its recurrent state read and written in the lanes' pages; only
    /// a backend whose `is_linear` says so is asked.
    fn linear(&mut self, li: usize) -> Result<(), Self::Error> {
        unreachable!("layer {li} has no linear attention on this backend")
    }
    /// delta = the sum of every tensor-parallel rank's delta, in rank order; with one rank, nothing.
    fn reduce(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
    /// x += delta.
    fn add(&mut self) -> Result<(), Self::Error>;
    /// Logits of the rows that want them: the final norm, then the output projection.
    fn logits(&mut self) -> Result<(), Self::Error>;
}

/// Runs a forward pass of `layers` layers through `steps`.
pub fn forward<S: LlamaSteps>(steps: &mut S, layers: usize) -> Result<(), S::Error> {
    steps.embed()?;
    for li in 0..layers {
        layer(steps, li)?;
    }
    steps.logits()
}

/// Runs decoder layer `li` (a draft head's layer too) on the stream `steps` holds.
pub fn layer<S: LlamaSteps>(steps: &mut S, li: usize) -> Result<(), S::Error> {
    steps.norm(li, LayerNorm::Input)?;
    if steps.is_linear(li) {
        steps.linear(li)?;
    } else {
        steps.qkv(li)?;
        steps.rope_store(li)?;
        steps.attend(li)?;
        steps.o_proj(li)?;
    }
    steps.reduce()?;
    steps.add()?;
    steps.norm(li, LayerNorm::PostAttention)?;
    steps.mlp(li)?;
    steps.reduce()?;
    steps.add()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each step as a word.
    struct Trace(Vec<String>);

    impl Trace {
        fn log(&mut self, step: String) -> Result<(), std::convert::Infallible> {
            self.0.push(step);
            Ok(())
        }
    }

    impl LlamaSteps for Trace {
        type Error = std::convert::Infallible;
        fn embed(&mut self) -> Result<(), Self::Error> {
            self.log("embed".into())
        }
        fn norm(&mut self, li: usize, which: LayerNorm) -> Result<(), Self::Error> {
            self.log(format!("{which:?}{li}"))
        }
        fn qkv(&mut self, li: usize) -> Result<(), Self::Error> {
            self.log(format!("qkv{li}"))
        }
        fn rope_store(&mut self, li: usize) -> Result<(), Self::Error> {
            self.log(format!("rope{li}"))
        }
        fn attend(&mut self, li: usize) -> Result<(), Self::Error> {
            self.log(format!("attend{li}"))
        }
        fn o_proj(&mut self, li: usize) -> Result<(), Self::Error> {
            self.log(format!("o{li}"))
        }
        fn gate_up(&mut self, li: usize) -> Result<(), Self::Error> {
            self.log(format!("gate_up{li}"))
        }
        fn down(&mut self, li: usize) -> Result<(), Self::Error> {
            self.log(format!("down{li}"))
        }
        fn add(&mut self) -> Result<(), Self::Error> {
            self.log("add".into())
        }
        fn logits(&mut self) -> Result<(), Self::Error> {
            self.log("logits".into())
        }
    }

    #[test]
    fn test_a_pass_runs_each_layer_pre_norm_attention_then_mlp() {
        let mut trace = Trace(Vec::new());
        forward(&mut trace, 2).unwrap();
        let layer = |i: usize| {
            let names = ["Input", "qkv", "rope", "attend", "o", "add", "PostAttention", "gate_up", "down", "add"];
            names.map(|n| if n == "add" { n.to_string() } else { format!("{n}{i}") })
        };
        let mut want = vec!["embed".to_string()];
        want.extend(layer(0));
        want.extend(layer(1));
        want.push("logits".into());
        assert_eq!(trace.0, want);
    }
}
