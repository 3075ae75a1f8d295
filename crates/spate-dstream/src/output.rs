//! Output operations: what happens to each batch at the end of the graph.

use std::fmt::{Debug, Display};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use spate_core::sync::lock;

use crate::batch::{Batch, Data};
use crate::error::{BoxError, DStreamError};
use crate::graph::{BatchInfo, Job, Released, SharedBuilder};
use crate::node::{Node, NodeMeta, Slot, StepCtx};
use crate::stream::DStream;

/// A handle to a registered output, to give it a stable name.
pub struct Output {
    builder: SharedBuilder,
    id: usize,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output").field("operator", &self.id).finish()
    }
}

impl Output {
    /// Names the output (its jobs and errors carry this name).
    pub fn name(self, name: &str) -> Self {
        if let Some(meta) = self.builder.borrow_mut().metas.get_mut(self.id) {
            meta.name = Some(name.to_string());
        }
        self
    }
}

/// What an output does with a batch: the batch is shared, and a writer
/// that wants it by value takes it without a copy when it is the last
/// holder. A writer that only read it hands it back, to be freed after
/// the job's outcome is reported.
type WriteBatch<T> = dyn Fn(Arc<Batch<T>>, BatchInfo) -> (Result<(), BoxError>, Option<Arc<Batch<T>>>) + Send + Sync;

struct OutputNode<T> {
    input: Arc<Slot<T>>,
    write: Arc<WriteBatch<T>>,
}

impl<T: Data> Node for OutputNode<T> {
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        let Some(batch) = ctx.take(&self.input)? else { return Ok(None) };
        let info = BatchInfo { time: ctx.time, batch_id: ctx.batch_id };
        let write = Arc::clone(&self.write);
        let operator = ctx.operator.to_string();
        let name = operator.clone();
        let run = Box::new(move || {
            let (result, read) = write(batch, info);
            let result = result.map_err(|source| match source.downcast::<DStreamError>() {
                Ok(own) => *own,
                Err(source) => {
                    DStreamError::Output { operator: name, batch_id: info.batch_id, time: info.time, source }
                }
            });
            (result, Released::new(read))
        });
        Ok(Some(Job { output: operator, info, run }))
    }
}

/// Writes a batch's records as text files into `dir`, replacing an earlier
/// attempt of the same batch, so a re-run batch leaves one copy.
fn write_text_dir<T: Display>(batch: &Batch<T>, dir: &Path) -> Result<(), std::io::Error> {
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(parent)?;
    let file_name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let staging = parent.join(format!(".{file_name}.tmp"));
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    fs::create_dir_all(&staging)?;
    for (index, part) in batch.partitions().iter().enumerate() {
        let mut file = std::io::BufWriter::new(fs::File::create(staging.join(format!("part-{index:05}")))?);
        for record in part {
            writeln!(file, "{record}")?;
        }
        file.into_inner().map_err(std::io::IntoInnerError::into_error)?.sync_all()?;
    }
    fs::File::create(staging.join("_SUCCESS"))?.sync_all()?;
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::rename(&staging, dir)?;
    fs::File::open(parent)?.sync_all()
}

impl<T: Data> DStream<T> {
    /// Registers an output: `write` gets every batch with its time and id
    /// (so a sink can be idempotent or transactional).
    pub fn foreach_batch<F>(&self, write: F) -> Output
    where
        F: Fn(&Batch<T>, BatchInfo) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.output(Arc::new(move |batch: Arc<Batch<T>>, info| (write(&batch, info), Some(batch))))
    }

    /// Like [`DStream::foreach_batch`], handing `write` the batch by value:
    /// without a copy when no other operator still reads it (the usual
    /// case), so a sink that passes the records on (to a producer, say)
    /// moves them instead of holding a second copy of the batch.
    pub fn foreach_batch_owned<F>(&self, write: F) -> Output
    where
        F: Fn(Batch<T>, BatchInfo) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.output(Arc::new(move |batch: Arc<Batch<T>>, info| (write(Arc::unwrap_or_clone(batch), info), None)))
    }

    fn output(&self, write: Arc<WriteBatch<T>>) -> Output {
        let input = self.reader();
        let mut meta = NodeMeta::new("foreach_batch", vec![self.id], self.slide);
        meta.is_output = true;
        let node = OutputNode { input, write };
        let id = self.builder.borrow_mut().push(meta, Box::new(node));
        Output { builder: std::rc::Rc::clone(&self.builder), id }
    }

    /// Prints the first `n` records of every batch to standard output, under
    /// a header with the batch time (as Spark's `print`).
    pub fn print(&self, n: usize) -> Output
    where
        T: Debug,
    {
        self.print_to(n, Arc::new(Mutex::new(std::io::stdout())))
    }

    /// Like [`DStream::print`], writing to `out`.
    pub fn print_to<W: Write + Send + 'static>(&self, n: usize, out: Arc<Mutex<W>>) -> Output
    where
        T: Debug,
    {
        let output = self.foreach_batch(move |batch, info| {
            let mut out = lock(&out);
            let rule = "-------------------------------------------";
            writeln!(out, "{rule}\nTime: {}\n{rule}", info.time)?;
            for record in batch.iter().take(n) {
                writeln!(out, "{record:?}")?;
            }
            if batch.len() > n {
                writeln!(out, "...")?;
            }
            writeln!(out)?;
            Ok(())
        });
        rename_output_kind(output, "print")
    }

    /// Writes every batch as text files (one per partition, one record per
    /// line) into the directory `<prefix>-<time in ms>[.<suffix>]`. A
    /// re-run batch replaces its directory, so each batch is written once.
    pub fn save_as_text_files(&self, prefix: &str, suffix: Option<&str>) -> Output
    where
        T: Display,
    {
        let prefix = prefix.to_string();
        let suffix = suffix.map(str::to_string);
        let output = self.foreach_batch(move |batch, info| {
            let mut name = format!("{prefix}-{}", info.time.as_millis());
            if let Some(suffix) = &suffix {
                name.push('.');
                name.push_str(suffix);
            }
            let dir = PathBuf::from(name);
            write_text_dir(batch, &dir).map_err(|source| {
                Box::new(DStreamError::Io { operator: format!("save_as_text_files({prefix})"), path: dir, source })
                    as BoxError
            })
        });
        rename_output_kind(output, "save_as_text_files")
    }
}

fn rename_output_kind(output: Output, kind: &'static str) -> Output {
    if let Some(meta) = output.builder.borrow_mut().metas.get_mut(output.id) {
        meta.kind = kind;
    }
    output
}
