//! `sluice plan --consistency converged`: what a converged run would cost, forecast from the
//! tables' recent change rate.

use crate::job::ExportJob;
use sluice_core::{Chunk, Dataset, Error};

/// How long `sluice plan` watches the tables' change counters.
const SAMPLE: std::time::Duration = std::time::Duration::from_secs(2);

/// `sluice plan --consistency converged`: from the tables' recent change rate (their counters
/// over [`SAMPLE`]) and the run's predicted length, how many keys would change, what
/// remembering them takes (past half of `--memory` they spill to disk), and what share of the row groups would be encoded again —
/// `1 - e^(-K/G)` for K changes spread evenly over G row groups (the rest is copied), an upper
/// bound (changes on recent rows touch few) — with the advice to use `snapshot` where more
/// than half would be.
pub(crate) async fn forecast(
    job: &ExportJob,
    datasets: &[Dataset],
    chunks: &[Chunk],
    run_seconds: f64,
) -> Vec<String> {
    let sample = async {
        let before = job.source.change_counts(datasets).await?;
        tokio::time::sleep(SAMPLE).await;
        let after = job.source.change_counts(datasets).await?;
        Ok::<_, Error>(before.zip(after))
    };
    let (before, after) = match sample.await {
        Ok(Some(counts)) => counts,
        Ok(None) => {
            return vec![format!(
                "converged: {} keeps no change counters, so the rows changed during a run \
                 cannot be forecast",
                job.source.engine()
            )];
        }
        Err(e) => return vec![format!("converged: the change rate could not be read: {e}")],
    };
    let mut notes = Vec::new();
    let mut key_bytes = 0.0;
    for ds in datasets {
        let (Some(b), Some(a)) = (before.get(&ds.name), after.get(&ds.name)) else {
            continue;
        };
        let rate = a.saturating_sub(*b) as f64 / SAMPLE.as_secs_f64();
        let changed = rate * run_seconds;
        let parts = chunks.iter().filter(|c| c.dataset == ds.name).count();
        // Row groups are cut by their size in memory, about the table's size on the server.
        let group = job.row_group_bytes.unwrap_or(super::ROW_GROUP_BYTES).max(1) as u64;
        let groups = (ds.estimate.bytes.div_ceil(group) as usize)
            .max(parts)
            .max(1) as f64;
        let rewritten = 1.0 - (-changed / groups).exp();
        key_bytes += changed * (48.0 + 32.0 * ds.primary_key.len().max(1) as f64);
        let advice = if rewritten > 0.5 {
            "; --consistency snapshot would write the output once and be cheaper here"
        } else {
            ""
        };
        notes.push(format!(
            "converged: {} changes {rate:.0} rows/s now (server counters over {} s): over a run \
             of about {run_seconds:.1} s up to {changed:.0} changed keys, encoding again up \
             to {:.0}% of its about {groups:.0} row groups if the changes are spread over the \
             table{advice}",
            ds.name,
            SAMPLE.as_secs(),
            100.0 * rewritten
        ));
    }
    if key_bytes > (job.memory / 2) as f64 {
        notes.push(format!(
            "converged: the changed keys would take about {:.0} MB, more than half of --memory \
             ({} MB): past that they spill to sorted files in the temporary directory ({}), \
             which costs disk and a merge at the end point; raise --memory to keep them in \
             memory",
            key_bytes / 1e6,
            job.memory >> 20,
            std::env::temp_dir().display()
        ));
    }
    notes
}
