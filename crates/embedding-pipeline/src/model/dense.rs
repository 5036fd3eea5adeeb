//! sentence-transformers' Dense module: a linear projection of the pooled vector and an activation
//! (`activation(W x + b)`, plus the input again under `use_residual`), with its weights read from the module
//! folder's `model.safetensors` in float32, float16 or bfloat16.

use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::model::spec::{Activation, DenseSpec};

/// One Dense module, its weights in float32.
#[derive(Debug)]
pub struct Dense {
    in_features: usize,
    out_features: usize,
    /// `linear.weight`, `[out, in]` row-major, as torch keeps it.
    weight: Vec<f32>,
    /// `linear.bias`, `[out]`.
    bias: Option<Vec<f32>>,
    activation: Activation,
    residual: Residual,
}

#[derive(Debug)]
enum Residual {
    None,
    /// The input added back as it is (in and out of the same size).
    Identity,
    /// The input added back through `residual.weight`, `[out, in]`.
    Projected(Vec<f32>),
}

impl Dense {
    /// Read the module's weights. `dir` only serves to name the model in errors.
    pub fn load(spec: &DenseSpec, dir: &std::path::Path) -> Result<Self> {
        let file = format!("{}/model.safetensors", spec.folder);
        let bad = |m: String| Error::model(dir, &file, m);
        let bytes = std::fs::read(&spec.weights).map_err(|e| bad(format!("cannot read: {e}")))?;
        let tensors = SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let (i, o) = (spec.in_features, spec.out_features);
        let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let t = tensors.tensor(name).map_err(|_| bad(format!("has no tensor `{name}`")))?;
            if t.shape() != shape {
                return Err(bad(format!("`{name}` has shape {:?}; the module's config says {shape:?}", t.shape())));
            }
            to_f32(t.dtype(), t.data()).ok_or_else(|| {
                bad(format!("`{name}` is {:?}; float32, float16 or bfloat16 weights are read", t.dtype()))
            })
        };
        let weight = read("linear.weight", &[o, i])?;
        let bias = if spec.bias { Some(read("linear.bias", &[o])?) } else { None };
        let residual = match (spec.residual, i == o) {
            (false, _) => Residual::None,
            (true, true) => Residual::Identity,
            (true, false) => Residual::Projected(read("residual.weight", &[o, i])?),
        };
        Ok(Self { in_features: i, out_features: o, weight, bias, activation: spec.activation, residual })
    }

    /// The projection of one vector of `in_features` values.
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        debug_assert_eq!(x.len(), self.in_features);
        let mut out = matvec(&self.weight, x, self.out_features);
        if let Some(b) = &self.bias {
            out.iter_mut().zip(b).for_each(|(o, b)| *o += b);
        }
        out.iter_mut().for_each(|o| *o = activate(self.activation, *o));
        match &self.residual {
            Residual::None => {}
            Residual::Identity => out.iter_mut().zip(x).for_each(|(o, x)| *o += x),
            Residual::Projected(w) => out.iter_mut().zip(matvec(w, x, self.out_features)).for_each(|(o, r)| *o += r),
        }
        out
    }
}

/// `w x` for a row-major `[rows, x.len()]` matrix.
fn matvec(w: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    (0..rows).map(|r| w[r * x.len()..(r + 1) * x.len()].iter().zip(x).map(|(w, x)| w * x).sum()).collect()
}

fn activate(a: Activation, x: f32) -> f32 {
    match a {
        Activation::Identity => x,
        Activation::Tanh => x.tanh(),
        Activation::Relu => x.max(0.0),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::Gelu => 0.5 * x * (1.0 + libm::erff(x / std::f32::consts::SQRT_2)),
        Activation::Silu => x / (1.0 + (-x).exp()),
    }
}

/// Little-endian float32, float16 or bfloat16 bytes as float32.
fn to_f32(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    let words = |n: usize| data.chunks_exact(n);
    match dtype {
        Dtype::F32 => Some(words(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()),
        Dtype::F16 => Some(words(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()),
        Dtype::BF16 => Some(words(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use safetensors::tensor::TensorView;

    use super::*;

    fn write(path: &std::path::Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: HashMap<String, TensorView<'_>> =
            tensors.iter().map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
        safetensors::serialize_to_file(&views, None, path).unwrap();
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn spec(dir: &std::path::Path, i: usize, o: usize, activation: Activation, residual: bool) -> DenseSpec {
        DenseSpec {
            folder: "2_Dense".into(),
            in_features: i,
            out_features: o,
            bias: true,
            activation,
            residual,
            weights: dir.join("model.safetensors"),
        }
    }

    /// W = [[1, 2], [3, 4], [0, -1]], b = [0.5, 0, 1]: W [1, 1] + b = [3.5, 7, 0].
    #[test]
    fn projects_then_activates_with_weights_in_any_float_type() {
        let tmp = tempfile::tempdir().unwrap();
        let w = [1.0f32, 2.0, 3.0, 4.0, 0.0, -1.0];
        let b = [0.5f32, 0.0, 1.0];
        let half: Vec<u8> = w.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect();
        for (dtype, bytes) in [(Dtype::F32, f32s(&w)), (Dtype::BF16, half)] {
            write(
                &tmp.path().join("model.safetensors"),
                &[("linear.weight", dtype, vec![3, 2], bytes), ("linear.bias", Dtype::F32, vec![3], f32s(&b))],
            );
            let d = Dense::load(&spec(tmp.path(), 2, 3, Activation::Identity, false), tmp.path()).unwrap();
            assert_eq!(d.apply(&[1.0, 1.0]), vec![3.5, 7.0, 0.0], "{dtype:?}");
        }
        let d = Dense::load(&spec(tmp.path(), 2, 3, Activation::Relu, false), tmp.path()).unwrap();
        assert_eq!(d.apply(&[-1.0, 0.0]), vec![0.0, 0.0, 1.0]);
        let d = Dense::load(&spec(tmp.path(), 2, 3, Activation::Tanh, false), tmp.path()).unwrap();
        assert_eq!(d.apply(&[1.0, 1.0]), vec![3.5f32.tanh(), 7.0f32.tanh(), 0.0]);
        let gelu = activate(Activation::Gelu, 1.0);
        assert!((gelu - 0.841_344_7).abs() < 1e-6, "{gelu}");
    }

    #[test]
    fn a_residual_adds_the_input_back_projected_when_sizes_differ() {
        let tmp = tempfile::tempdir().unwrap();
        let (w, b, r) = ([1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], [0.0f32; 3], [1.0f32, 1.0, 2.0, 2.0, 0.0, 0.0]);
        write(
            &tmp.path().join("model.safetensors"),
            &[
                ("linear.weight", Dtype::F32, vec![3, 2], f32s(&w)),
                ("linear.bias", Dtype::F32, vec![3], f32s(&b)),
                ("residual.weight", Dtype::F32, vec![3, 2], f32s(&r)),
            ],
        );
        let d = Dense::load(&spec(tmp.path(), 2, 3, Activation::Identity, true), tmp.path()).unwrap();
        assert_eq!(d.apply(&[1.0, 2.0]), vec![1.0 + 3.0, 2.0 + 6.0, 3.0]);
    }

    #[test]
    fn a_missing_tensor_or_a_wrong_shape_or_type_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("model.safetensors");
        write(&path, &[("linear.weight", Dtype::F32, vec![2, 2], f32s(&[0.0; 4]))]);
        let e = Dense::load(&spec(tmp.path(), 2, 3, Activation::Tanh, false), tmp.path()).unwrap_err().to_string();
        assert!(e.contains("2_Dense/model.safetensors") && e.contains("linear.weight") && e.contains("[3, 2]"), "{e}");
        write(&path, &[("linear.weight", Dtype::F32, vec![3, 2], f32s(&[0.0; 6]))]);
        let e = Dense::load(&spec(tmp.path(), 2, 3, Activation::Tanh, false), tmp.path()).unwrap_err().to_string();
        assert!(e.contains("has no tensor `linear.bias`"), "{e}");
        write(
            &path,
            &[
                ("linear.weight", Dtype::I64, vec![3, 2], vec![0; 48]),
                ("linear.bias", Dtype::F32, vec![3], f32s(&[0.0; 3])),
            ],
        );
        let e = Dense::load(&spec(tmp.path(), 2, 3, Activation::Tanh, false), tmp.path()).unwrap_err().to_string();
        assert!(e.contains("I64") && e.contains("bfloat16"), "{e}");
        std::fs::write(&path, b"not safetensors").unwrap();
        let e = Dense::load(&spec(tmp.path(), 2, 3, Activation::Tanh, false), tmp.path()).unwrap_err().to_string();
        assert!(e.contains("not a safetensors file"), "{e}");
    }
}
