//! One writer per dataset at a time: a campaign's write, `pipeline index` and `pipeline optimize` each hold
//! an exclusive advisory lock on a file beside the dataset while they work, so none of them plans from a
//! dataset another is changing (a compaction under a live write would rewrite fragments the write's resume
//! has counted; a cleanup at `0s` would remove files a write has yet to commit). The lock file names its
//! holder, so whoever is refused is told what to wait for.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What holds a dataset's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A write into the dataset (`pipeline run`, `pipeline trial`).
    Run,
    Index,
    Optimize,
}

impl Holder {
    fn name(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Index => "index",
            Self::Optimize => "optimize",
        }
    }

    fn advice(self) -> &'static str {
        match self {
            Self::Run => {
                "wait for it to finish (stopped, it keeps what it committed and its job resumes when run again)"
            }
            Self::Index | Self::Optimize => "wait for it to finish",
        }
    }
}

/// An exclusive advisory lock on a dataset, held until dropped and released when the process ends, however
/// it ends.
#[derive(Debug)]
pub struct WriteLock {
    _file: std::fs::File,
}

impl WriteLock {
    /// Take the lock of the dataset at `uri` for `holder`, or say who holds it.
    pub fn acquire(uri: &str, holder: Holder) -> Result<Self> {
        let path = lock_path(uri);
        let failed = |what: &str, e: std::io::Error| {
            Error::lance_because(uri, format!("cannot {what} the lock file {}: {e}", path.display()), e)
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| failed("create the folder of", e))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| failed("open", e))?;
        match file.try_lock() {
            Ok(()) => {
                // The holder's name, for whoever is refused (best effort: the lock is what counts).
                let _ = file
                    .set_len(0)
                    .and_then(|()| file.rewind())
                    .and_then(|()| write!(file, "pipeline {} (process {})", holder.name(), std::process::id()));
                Ok(Self { _file: file })
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut held_by = String::new();
                let _ = file.read_to_string(&mut held_by);
                let other = [Holder::Run, Holder::Index, Holder::Optimize]
                    .into_iter()
                    .find(|h| held_by.starts_with(&format!("pipeline {} ", h.name())))
                    // A lock file from before holders were named: only runs took locks then.
                    .unwrap_or(Holder::Run);
                Err(Error::Busy {
                    uri: uri.to_string(),
                    holder: format!("pipeline {}", other.name()),
                    lock: path.display().to_string(),
                    advice: other.advice().to_string(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => Err(failed("lock", e)),
        }
    }
}

/// `dir/.name.lance.lock` for the local dataset `dir/name.lance`. An object store has no advisory locks:
/// the lock of an `s3://` dataset is a file named by the URI's digest in the install home, so it keeps
/// runs on one machine apart, and no more (see the README on object stores).
pub fn lock_path(uri: &str) -> PathBuf {
    if !crate::uri::is_local(uri) {
        let home = crate::model::runtime::install_home().unwrap_or_else(std::env::temp_dir);
        let digest = crate::campaign::digest::hex_sha256(uri.trim_end_matches('/').as_bytes());
        return home.join("locks").join(format!("{}.lock", &digest[..16]));
    }
    let p = real_path(std::path::Path::new(uri));
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "dataset".into());
    p.with_file_name(format!(".{name}.lock"))
}

/// The folder `path` names, however it is named: absolute, with symbolic links (its own included, even one to a
/// folder not made yet), `.` and `..` resolved, so that two names of one dataset take one lock.
pub fn real_path(path: &Path) -> PathBuf {
    resolve(&std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()), 0)
}

fn resolve(path: &Path, depth: usize) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    // A link whose target does not exist yet: where it points, resolved.
    if depth < 16
        && let Ok(target) = std::fs::read_link(path)
    {
        let parent = path.parent().unwrap_or(Path::new("/"));
        return resolve(&parent.join(target), depth + 1);
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => resolve(parent, depth).join(name),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_and_told_who_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dir.path().join("v.lance").display().to_string();
        let first = WriteLock::acquire(&uri, Holder::Optimize).unwrap();
        let err = WriteLock::acquire(&uri, Holder::Run).unwrap_err().to_string();
        assert!(err.contains("another pipeline optimize is writing to"), "{err}");
        assert!(err.ends_with("; wait for it to finish"), "{err}");
        drop(first);
        let run = WriteLock::acquire(&uri, Holder::Run).unwrap();
        let err = WriteLock::acquire(&uri, Holder::Index).unwrap_err().to_string();
        assert!(err.contains("another pipeline run is writing to"), "{err}");
        drop(run);
        WriteLock::acquire(&uri, Holder::Index).unwrap();
    }

    /// Two names of one dataset: a symbolic link to it (made before or after the dataset), a relative path,
    /// `..` and a trailing slash all take the one lock.
    #[test]
    fn every_name_of_a_dataset_takes_its_one_lock() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("out.lance");
        std::os::unix::fs::symlink(&real, dir.path().join("early.lance")).unwrap(); // dangling: no dataset yet
        std::fs::create_dir_all(real.join("_versions")).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("late.lance")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let first = WriteLock::acquire(&real.display().to_string(), Holder::Run).unwrap();
        let d = dir.path().display();
        for other in [
            format!("{d}/early.lance"),
            format!("{d}/late.lance"),
            format!("{d}/sub/../out.lance"),
            format!("{d}/out.lance/"),
        ] {
            let err = WriteLock::acquire(&other, Holder::Run).unwrap_err().to_string();
            assert!(err.contains("another pipeline run is writing to"), "{other}: {err}");
        }
        drop(first);
        // A dangling link to a dataset yet to be made locks where the dataset will be.
        std::fs::remove_dir_all(&real).unwrap();
        let _early = WriteLock::acquire(&format!("{d}/early.lance"), Holder::Run).unwrap();
        assert!(WriteLock::acquire(&real.display().to_string(), Holder::Run).is_err());
    }
}
