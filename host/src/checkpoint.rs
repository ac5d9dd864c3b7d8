//! Checkpoints: named tensors (parameters and optimizer state) in the safetensors format.

use crate::error::{Error, Result};
use crate::tensor::{CpuStorage, DType, Tensor};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

struct View {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl safetensors::View for View {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn view(t: &Tensor) -> Result<View> {
    let s = t.storage().to_cpu()?;
    let (dtype, bytes) = match &s {
        CpuStorage::F32(v) => (safetensors::Dtype::F32, bytemuck::cast_slice(v).to_vec()),
        CpuStorage::F64(v) => (safetensors::Dtype::F64, bytemuck::cast_slice(v).to_vec()),
        CpuStorage::BF16(v) => (safetensors::Dtype::BF16, bytemuck::cast_slice(v).to_vec()),
        CpuStorage::F16(v) => (safetensors::Dtype::F16, bytemuck::cast_slice(v).to_vec()),
    };
    Ok(View { dtype, shape: t.dims().to_vec(), bytes })
}

fn file_err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::File { path: path.to_path_buf(), msg: msg.to_string() }
}

/// Writes named tensors to `path`, with string metadata.
pub fn save(path: &Path, tensors: &[(String, Tensor)], metadata: HashMap<String, String>) -> Result<()> {
    let views: Vec<(String, View)> = tensors.iter().map(|(n, t)| Ok((n.clone(), view(t)?))).collect::<Result<_>>()?;
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| file_err(path, e))
}

/// Reads every tensor of a safetensors file, and its metadata.
pub fn load(path: &Path) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, e))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| file_err(path, e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| file_err(path, e))?;
    let mut out = HashMap::new();
    for (name, v) in st.tensors() {
        let data = v.data();
        let storage = match v.dtype() {
            safetensors::Dtype::F32 => CpuStorage::F32(bytemuck::pod_collect_to_vec(data)),
            safetensors::Dtype::F64 => CpuStorage::F64(bytemuck::pod_collect_to_vec(data)),
            safetensors::Dtype::BF16 => CpuStorage::BF16(bytemuck::pod_collect_to_vec(data)),
            safetensors::Dtype::F16 => CpuStorage::F16(bytemuck::pod_collect_to_vec(data)),
            other => {
                return Err(file_err(path, format!("tensor `{name}` has dtype {other:?}, which kiln does not load")));
            }
        };
        let shape = crate::tensor::Shape::from(v.shape().to_vec());
        if shape.elem_count() != storage.len() {
            return Err(file_err(path, format!("tensor `{name}`: {} values for shape {shape}", storage.len())));
        }
        out.insert(name, Tensor::from_cpu(storage, shape, None));
    }
    Ok((out, meta.metadata().clone().unwrap_or_default()))
}

/// Copies saved values into `params` by name; every parameter must be present with its shape.
pub fn assign(params: &[(String, Tensor)], saved: &HashMap<String, Tensor>, prefix: &str) -> Result<()> {
    for (name, p) in params {
        let key = format!("{prefix}{name}");
        let t = saved
            .get(&key)
            .ok_or_else(|| Error::shape("load checkpoint", format!("no tensor `{key}` in the checkpoint")))?;
        if t.shape() != p.shape() {
            return Err(Error::shape(
                "load checkpoint",
                format!("`{key}` has shape {}, the model expects {}", t.shape(), p.shape()),
            ));
        }
        let t = if t.dtype() != p.dtype() { t.to_dtype(p.dtype())? } else { t.clone() };
        p.set_data(&t)?;
    }
    Ok(())
}

/// The dtype of a checkpoint's tensor, for messages.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
    }
}
