//! A cross-encoder's head: the features of a pair's first token, then one logit.

use crate::ModelError;
use crate::weights::{TensorSource, require};

/// A cross-encoder's head, on the host (it scores one row per pair): a `tanh(W·x + b)` layer of
/// the first token (BERT's pooler, XLM-RoBERTa's `classifier.dense`) when the file has one, and
/// a one-label classifier. llama.cpp's converter leaves a `BertForSequenceClassification`'s
/// pooler out of its GGUF; such a file is scored as llama.cpp scores it, by the classifier on the
/// first token's state.
pub(super) struct RankHead {
    pooler: Option<(Vec<f32>, Vec<f32>)>,
    class_w: Vec<f32>,
    class_b: f32,
}

impl RankHead {
    /// The logit of one pair from its first token's final state.
    pub(super) fn score(&self, x: &[f32]) -> f32 {
        let h = x.len();
        let dot = |row: &[f32], v: &[f64]| -> f64 {
            row.iter().zip(v).map(|(w, v)| f64::from(*w) * v).sum()
        };
        let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let features = match &self.pooler {
            Some((w, b)) => (w.chunks_exact(h).zip(b))
                .map(|(row, b)| (dot(row, &x) + f64::from(*b)).tanh())
                .collect(),
            None => x,
        };
        (dot(&self.class_w, &features) + f64::from(self.class_b)) as f32
    }
}

/// Rows of table `name` whose rows are `h` wide (1 when it cannot be read: `require` names it).
pub(super) fn table_rows(src: &dyn TensorSource, name: &str, h: usize) -> usize {
    src.tensor_shapes()
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, s)| match s.as_slice() {
            [r, c] if *c == h => Some(*r),
            [c, r] if *c == h => Some(*r),
            _ => None,
        })
        .unwrap_or(1)
        .max(1)
}

/// A cross-encoder's head, when `src` has one: BERT's (`{p}pooler.dense` and `classifier`) or
/// RoBERTa's (`classifier.dense` and `classifier.out_proj`).
pub(super) fn rank_head(
    src: &dyn TensorSource,
    p: &str,
    h: usize,
) -> Result<Option<RankHead>, ModelError> {
    let shapes = src.tensor_shapes();
    let has = |name: &str| shapes.iter().any(|(n, _)| n == name);
    let (pooler, classifier) = if has("classifier.out_proj.weight") {
        ("classifier.dense".to_string(), "classifier.out_proj")
    } else if has("classifier.weight") {
        (format!("{p}pooler.dense"), "classifier")
    } else {
        return Ok(None);
    };
    let f32s = |name: &str, rows: usize, cols: usize| -> Result<Vec<f32>, ModelError> {
        require(src, name, rows, cols)?.to_f32()
    };
    let class_w = format!("{classifier}.weight");
    let labels = table_rows(src, &class_w, h);
    if labels != 1 {
        return Err(ModelError::Tensor {
            path: src.path().into(),
            name: class_w,
            reason: format!("{labels} labels; a reranker scores with one"),
        });
    }
    let pool_w = format!("{pooler}.weight");
    let pooler = if has(&pool_w) {
        Some((f32s(&pool_w, h, h)?, f32s(&format!("{pooler}.bias"), 1, h)?))
    } else {
        None
    };
    Ok(Some(RankHead {
        pooler,
        class_w: f32s(&class_w, 1, h)?,
        class_b: f32s(&format!("{classifier}.bias"), 1, 1)?[0],
    }))
}
