//! Checkpoints: named tensors (parameters and optimizer state) in the safetensors format, saved so
//! that a failed save never loses the last good file, and checked when loaded.
//!
//! - **Atomic saves.** [`save`] writes a temporary file beside the target (`.NAME.PID.N.kiln-tmp`),
//!   flushes and syncs it, renames it over the target and syncs the folder (on Unix). A save that
//!   fails at any point (a full disk, a file-size limit, a folder that vanished) leaves the file
//!   that was at the path byte for byte, and removes its temporary file. Only a process killed in
//!   the middle of a save can leave a temporary file behind; the target is intact then too.
//! - **Checksums.** Each tensor's CRC32 is stored in the file's metadata under
//!   `kiln.crc32.<tensor name>` ([`CHECKSUM_PREFIX`]). [`load`] checks every one and reports a
//!   tensor whose data changed as [`Error::CorruptCheckpoint`], naming the tensor. Files without
//!   checksums (written by kiln before checksums existed, or by another tool) load unchecked.
//! - **Training checkpoints in one call.** [`save_training`] writes a model's parameters, its
//!   optimizer's state and a [`TrainingState`] (step, epoch, the run's configuration);
//!   [`load_training`] restores all three into a model and optimizer built the same way.
//! - **The destination checked first.** [`check_destination`] says, before any work, whether a
//!   checkpoint can be written to a path (the training loop calls it before its first step).
//!
//! ```
//! use kiln::checkpoint::{TrainingState, load_training, save_training};
//! use kiln::nn::{Activation, Module, mlp};
//! use kiln::optim::Adam;
//! use kiln::{DType, Tensor};
//!
//! # fn main() -> kiln::Result<()> {
//! # let dir = std::env::temp_dir().join(format!("kiln-doc-checkpoint-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("run.safetensors");
//! let model = mlp(2, 64, 3, 3, Activation::Relu, DType::F32, &mut Tensor::rng(0))?;
//! let opt = Adam::adam(model.named_parameters(), 1e-2, 0.0);
//! // ... train ...
//! let config = [("width".to_string(), "64".to_string())].into();
//! save_training(&path, &model, &opt, &TrainingState { step: 1200, epoch: 10, config })?;
//!
//! // later: the same architecture and optimizer, then everything restored
//! let model = mlp(2, 64, 3, 3, Activation::Relu, DType::F32, &mut Tensor::rng(1))?;
//! let mut opt = Adam::adam(model.named_parameters(), 1e-2, 0.0);
//! let state = load_training(&path, &model, &mut opt)?;
//! assert_eq!((state.step, state.epoch, state.config["width"].as_str()), (1200, 10, "64"));
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok(())
//! # }
//! ```

use crate::error::{Error, Result};
use crate::nn::Module;
use crate::optim::Optimizer;
use crate::tensor::{CpuStorage, DType, Tensor};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The metadata key prefix of the per-tensor checksums: `kiln.crc32.<tensor name>` holds the CRC32
/// of the tensor's bytes as 8 hex digits. [`load`] removes these keys from the metadata it returns.
pub const CHECKSUM_PREFIX: &str = "kiln.crc32.";
/// The name prefix of the optimizer-state tensors in a training checkpoint (`optim.adam.m.0.weight`).
pub const OPTIMIZER_PREFIX: &str = "optim.";
/// The prefix of the metadata keys kiln writes itself (checksums, step, epoch).
const RESERVED_PREFIX: &str = "kiln.";
const STEP_KEY: &str = "kiln.step";
const EPOCH_KEY: &str = "kiln.epoch";

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
    let s = t.data()?.to_cpu()?;
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

/// Writes named tensors to `path`, with string metadata, atomically (see the module docs): on any
/// error the file that was at `path` is unchanged. Each tensor's CRC32 is added to the metadata.
pub fn save(path: &Path, tensors: &[(String, Tensor)], metadata: HashMap<String, String>) -> Result<()> {
    save_with(path, tensors, metadata, |file, bytes| file.write_all(bytes))
}

/// [`save`], with the bytes written to the temporary file by `write` (the tests make it fail).
fn save_with(
    path: &Path,
    tensors: &[(String, Tensor)],
    mut metadata: HashMap<String, String>,
    write: impl FnOnce(&mut File, &[u8]) -> io::Result<()>,
) -> Result<()> {
    if let Some(k) = metadata.keys().find(|k| k.starts_with(CHECKSUM_PREFIX)) {
        return Err(file_err(
            path,
            format!("metadata key `{k}`: keys starting with `{CHECKSUM_PREFIX}` are kiln's checksums"),
        ));
    }
    let mut names = HashSet::new();
    if let Some((n, _)) = tensors.iter().find(|(n, _)| !names.insert(n.as_str())) {
        return Err(file_err(path, format!("two tensors are named `{n}`")));
    }
    let views: Vec<(String, View)> = tensors.iter().map(|(n, t)| Ok((n.clone(), view(t)?))).collect::<Result<_>>()?;
    for (name, v) in &views {
        metadata.insert(format!("{CHECKSUM_PREFIX}{name}"), format!("{:08x}", crc32fast::hash(&v.bytes)));
    }
    let bytes = safetensors::serialize(views, Some(metadata)).map_err(|e| file_err(path, e))?;
    write_atomically(path, |file| write(file, &bytes))
}

/// The file a save replaces: `path`, or the file a symbolic link at `path` points to (a save
/// replaces the file and keeps the link).
fn resolve(path: &Path) -> PathBuf {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

/// The folder holding `path` (`.` for a bare file name).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Distinguishes the temporary files of concurrent saves in one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A new, empty temporary file in `target`'s folder, and its path.
fn create_temp(target: &Path) -> io::Result<(PathBuf, File)> {
    let name =
        target.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    loop {
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".{}.{}.kiln-tmp", std::process::id(), TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)));
        let tmp = folder_of(target).join(tmp);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes a temporary file with `write`, syncs it and renames it over `path`'s target; on any
/// error the temporary file is removed and the target is untouched.
fn write_atomically(path: &Path, write: impl FnOnce(&mut File) -> io::Result<()>) -> Result<()> {
    let target = resolve(path);
    let (tmp, mut file) = create_temp(&target)
        .map_err(|e| file_err(path, format!("cannot create a file in its folder ({e}); nothing was written")))?;
    let written = (|| {
        write(&mut file)?;
        file.flush()?;
        // a replaced file keeps its permissions
        if let Ok(m) = fs::metadata(&target)
            && m.is_file()
        {
            file.set_permissions(m.permissions())?;
        }
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, &target)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(file_err(path, format!("saving failed ({e}); the file at this path, if any, is unchanged")));
    }
    sync_folder(folder_of(&target));
    Ok(())
}

/// Makes a rename durable by syncing the folder's entries (Unix). A filesystem that cannot sync a
/// folder has done the rename all the same, so a failure here is not an error.
fn sync_folder(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// Checks, without writing the checkpoint, that [`save`] can write to `path`: the path names a
/// file (not a folder) in a folder that exists, and a file can be created in that folder (tried
/// for real, then removed). The error is [`Error::CheckpointDestination`], naming the path.
pub fn check_destination(path: &Path) -> Result<()> {
    let err = |msg: String| Error::CheckpointDestination { path: path.to_path_buf(), msg };
    let target = resolve(path);
    if target.file_name().is_none() {
        return Err(err("the path names no file".into()));
    }
    if target.is_dir() {
        return Err(err("that is a folder".into()));
    }
    let dir = folder_of(&target);
    match fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(err(format!("the folder {} does not exist", dir.display())));
        }
        Err(e) => return Err(err(format!("the folder {}: {e}", dir.display()))),
        Ok(m) if !m.is_dir() => return Err(err(format!("{} is not a folder", dir.display()))),
        Ok(_) => {}
    }
    let (tmp, file) =
        create_temp(&target).map_err(|e| err(format!("cannot create a file in {}: {e}", dir.display())))?;
    drop(file);
    let _ = fs::remove_file(&tmp);
    Ok(())
}

/// Takes the checksums out of a file's metadata: tensor name -> CRC32.
fn take_checksums(path: &Path, meta: &mut HashMap<String, String>) -> Result<HashMap<String, u32>> {
    let keys: Vec<String> = meta.keys().filter(|k| k.starts_with(CHECKSUM_PREFIX)).cloned().collect();
    let mut sums = HashMap::new();
    for k in keys {
        let v = meta.remove(&k).expect("a key just listed");
        let name = &k[CHECKSUM_PREFIX.len()..];
        let sum = (v.len() == 8 && v.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(&v, 16).ok())
            .flatten()
            .ok_or_else(|| {
                file_err(path, format!("the checksum of tensor `{name}` is `{v}`, not 8 hex digits (a damaged header)"))
            })?;
        sums.insert(name.to_string(), sum);
    }
    Ok(sums)
}

/// Reads every tensor of a safetensors file, and its metadata (without the checksum keys).
///
/// When the file has checksums, every tensor must have one and match it: a tensor whose data
/// changed is [`Error::CorruptCheckpoint`], naming it. A file without checksums loads unchecked.
pub fn load(path: &Path) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let bytes = fs::read(path).map_err(|e| file_err(path, e))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| file_err(path, e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| file_err(path, e))?;
    let mut meta = meta.metadata().clone().unwrap_or_default();
    let sums = take_checksums(path, &mut meta)?;
    let tensors = st.tensors();
    if !sums.is_empty() {
        let names: HashSet<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
        if let Some(n) = sums.keys().find(|n| !names.contains(n.as_str())) {
            return Err(file_err(
                path,
                format!("a checksum for tensor `{n}`, which the file does not hold (a damaged header)"),
            ));
        }
    }
    let mut out = HashMap::new();
    for (name, v) in tensors {
        let data = v.data();
        if !sums.is_empty() {
            let expected = *sums.get(&name).ok_or_else(|| {
                file_err(path, format!("tensor `{name}` has no checksum while the others have (a damaged header)"))
            })?;
            let actual = crc32fast::hash(data);
            if actual != expected {
                return Err(Error::CorruptCheckpoint { path: path.to_path_buf(), tensor: name, expected, actual });
            }
        }
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
    Ok((out, meta))
}

/// Copies saved values into `params` by name (converted to each parameter's dtype and moved to
/// its device). Every parameter must be present with its shape; all are checked before any is
/// written, so on an error `params` are unchanged.
pub fn assign(params: &[(String, Tensor)], saved: &HashMap<String, Tensor>, prefix: &str) -> Result<()> {
    let mut found = Vec::with_capacity(params.len());
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
        found.push(t);
    }
    for ((_, p), t) in params.iter().zip(found) {
        let t = if t.dtype() != p.dtype() { t.to_dtype(p.dtype())? } else { t.clone() };
        p.set_data(&t.to_device(&p.device())?)?;
    }
    Ok(())
}

/// Where a training run stands, saved beside the model and the optimizer by [`save_training`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrainingState {
    /// Optimizer steps taken.
    pub step: u64,
    /// Epochs completed.
    pub epoch: u64,
    /// The run's configuration as text: the model's shape, the hyperparameters, the data (the
    /// training loop writes what `kiln eval` needs to rebuild the model). Keys starting with
    /// `kiln.` are kiln's own and refused.
    pub config: HashMap<String, String>,
}

/// Saves `model`'s parameters (under their names), `optimizer`'s state (under
/// [`OPTIMIZER_PREFIX`]) and `state` to `path` in one atomic [`save`].
pub fn save_training(
    path: &Path,
    model: &(impl Module + ?Sized),
    optimizer: &(impl Optimizer + ?Sized),
    state: &TrainingState,
) -> Result<()> {
    if let Some(k) = state.config.keys().find(|k| k.starts_with(RESERVED_PREFIX)) {
        return Err(file_err(path, format!("config key `{k}`: keys starting with `{RESERVED_PREFIX}` are kiln's own")));
    }
    let mut tensors = model.named_parameters();
    if let Some((n, _)) = tensors.iter().find(|(n, _)| n.starts_with(OPTIMIZER_PREFIX)) {
        return Err(file_err(
            path,
            format!("parameter `{n}`: names starting with `{OPTIMIZER_PREFIX}` hold the optimizer's state"),
        ));
    }
    tensors.extend(optimizer.state()?.into_iter().map(|(n, t)| (format!("{OPTIMIZER_PREFIX}{n}"), t)));
    let mut metadata = state.config.clone();
    metadata.insert(STEP_KEY.into(), state.step.to_string());
    metadata.insert(EPOCH_KEY.into(), state.epoch.to_string());
    save(path, &tensors, metadata)
}

/// Loads a checkpoint written by [`save_training`] into `model` and `optimizer` (built with the
/// same architecture and the same kind of optimizer over `model`'s parameters), and returns its
/// [`TrainingState`]. The checksums are checked and the file's contents validated before the model
/// is touched; an optimizer that refuses its state can leave the model loaded and the optimizer
/// partly loaded, so discard both on an error.
pub fn load_training(
    path: &Path,
    model: &(impl Module + ?Sized),
    optimizer: &mut (impl Optimizer + ?Sized),
) -> Result<TrainingState> {
    let (tensors, mut config) = load(path)?;
    let mut count = |key: &str| -> Result<u64> {
        let v = config.remove(key).ok_or_else(|| {
            file_err(
                path,
                format!(
                    "no `{key}` in its metadata: it holds no training state (it was written by checkpoint::save, \
                     or by a kiln older than save_training); load its parameters with checkpoint::load and \
                     checkpoint::assign"
                ),
            )
        })?;
        v.parse().map_err(|_| file_err(path, format!("metadata `{key}` is `{v}`, not a count")))
    };
    let step = count(STEP_KEY)?;
    let epoch = count(EPOCH_KEY)?;
    assign(&model.named_parameters(), &tensors, "")?;
    let state: HashMap<String, Tensor> = tensors
        .iter()
        .filter_map(|(k, t)| k.strip_prefix(OPTIMIZER_PREFIX).map(|k| (k.to_string(), t.clone())))
        .collect();
    optimizer.load_state(&state)?;
    Ok(TrainingState { step, epoch, config })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kiln-unit-ckpt-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("a temporary folder");
        d
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .expect("a folder")
            .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn tensors(fill: f64) -> Vec<(String, Tensor)> {
        let w = Tensor::from_f64(&[fill; 600], [20, 30], DType::F32).expect("a tensor");
        vec![("w".to_string(), w)]
    }

    /// A write that fails halfway through (the injected writer writes half the bytes, then
    /// fails as a full disk would) leaves the previous file byte-identical and no temporary file.
    #[test]
    fn a_write_that_fails_midway_leaves_the_previous_file_and_no_temporary() {
        let dir = tmpdir("midway");
        let path = dir.join("c.safetensors");
        save(&path, &tensors(1.0), HashMap::new()).expect("the first save");
        let good = fs::read(&path).expect("the saved file");
        let e = save_with(&path, &tensors(2.0), HashMap::new(), |f, bytes| {
            f.write_all(&bytes[..bytes.len() / 2])?;
            Err(io::Error::other("no space left (injected)"))
        })
        .expect_err("the write failed")
        .to_string();
        assert!(e.contains("c.safetensors") && e.contains("injected") && e.contains("unchanged"), "{e}");
        assert!(fs::read(&path).expect("the file") == good, "the previous file changed");
        assert_eq!(entries(&dir), ["c.safetensors"]);
        // the same save without the failure replaces the file
        save(&path, &tensors(2.0), HashMap::new()).expect("the second save");
        assert_eq!(load(&path).expect("loads").0["w"].to_vec_f64(), vec![2.0; 600]);
        assert_eq!(entries(&dir), ["c.safetensors"]);
        let _ = fs::remove_dir_all(&dir);
    }

    /// A rename that fails (the path is a folder) after the whole file was written and synced
    /// removes the temporary file and leaves the folder as it was.
    #[test]
    fn a_failed_rename_removes_the_temporary_file() {
        let dir = tmpdir("rename");
        let path = dir.join("c.safetensors");
        fs::create_dir(&path).expect("a folder at the path");
        fs::write(path.join("inside"), b"x").expect("a file in it");
        let e = save(&path, &tensors(1.0), HashMap::new()).expect_err("a folder cannot be replaced").to_string();
        assert!(e.contains("unchanged"), "{e}");
        assert_eq!(entries(&dir), ["c.safetensors"]);
        assert_eq!(entries(&path), ["inside"]);
        let _ = fs::remove_dir_all(&dir);
    }

    /// Metadata keys that would pass for kiln's checksums are refused.
    #[test]
    fn checksum_keys_are_reserved() {
        let dir = tmpdir("reserved");
        let meta = HashMap::from([(format!("{CHECKSUM_PREFIX}w"), "00000000".to_string())]);
        let e = save(&dir.join("c.safetensors"), &tensors(1.0), meta).expect_err("refused").to_string();
        assert!(e.contains("kiln.crc32.w"), "{e}");
        assert!(entries(&dir).is_empty());
        let _ = fs::remove_dir_all(&dir);
    }
}
