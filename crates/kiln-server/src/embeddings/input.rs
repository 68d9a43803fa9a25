//! An embeddings request's `input`: a string, a list of strings, a list of token ids, or a
//! list of such lists; each checked and tokenized for the model.

use serde_json::Value;

use crate::errors::ApiError;
use crate::state::ModelInfo;

/// The inputs of one request, before tokenizing.
#[derive(Debug, PartialEq)]
pub enum Inputs {
    /// Texts.
    Texts(Vec<String>),
    /// Token ids.
    Tokens(Vec<Vec<u64>>),
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg).with_code("invalid_input")
}

const SHAPES: &str = "input must be a string, a list of strings, a list of token ids, or a list of lists of token ids";

fn token_list(v: &[Value], at: &str) -> Result<Vec<u64>, ApiError> {
    v.iter()
        .enumerate()
        .map(|(j, t)| {
            t.as_u64().ok_or_else(|| {
                bad(format!(
                    "{at}[{j}] must be a token id (a non-negative integer)"
                ))
            })
        })
        .collect()
}

impl Inputs {
    /// Reads `field`; more than `max` inputs, none, or an empty one is refused, naming it.
    pub fn parse(field: Option<&Value>, max: usize) -> Result<Self, ApiError> {
        let inputs = match field {
            None | Some(Value::Null) => return Err(bad("input is required")),
            Some(Value::String(s)) => Self::Texts(vec![s.clone()]),
            Some(Value::Array(items)) if items.is_empty() => {
                return Err(bad("input is an empty list"));
            }
            Some(Value::Array(items)) => match &items[0] {
                Value::String(_) => Self::Texts(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| {
                            v.as_str().map(String::from).ok_or_else(|| {
                                bad(format!("input[{i}] must be a string, as input[0] is"))
                            })
                        })
                        .collect::<Result<_, _>>()?,
                ),
                Value::Number(_) => Self::Tokens(vec![token_list(items, "input")?]),
                Value::Array(_) => Self::Tokens(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| match v {
                            Value::Array(ids) => token_list(ids, &format!("input[{i}]")),
                            _ => Err(bad(format!(
                                "input[{i}] must be a list of token ids, as input[0] is"
                            ))),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                _ => return Err(bad(SHAPES)),
            },
            Some(_) => return Err(bad(SHAPES)),
        };
        let n = inputs.len();
        if n > max {
            return Err(bad(format!(
                "input has {n} items; at most {max} are taken per request (--max-batch-inputs)"
            )));
        }
        if let Some(i) = inputs.first_empty() {
            return Err(bad(format!("input[{i}] is empty")));
        }
        Ok(inputs)
    }

    fn len(&self) -> usize {
        match self {
            Self::Texts(t) => t.len(),
            Self::Tokens(t) => t.len(),
        }
    }

    fn first_empty(&self) -> Option<usize> {
        match self {
            Self::Texts(t) => t.iter().position(|s| s.is_empty()),
            Self::Tokens(t) => t.iter().position(Vec::is_empty),
        }
    }

    /// Token ids for `model` (texts with its special tokens, as its pipeline adds them); an
    /// input longer than the context is cut to it with `truncate`, else refused naming both
    /// lengths; ids beyond the vocabulary are refused.
    pub fn tokenize(self, model: &ModelInfo, truncate: bool) -> Result<Vec<Vec<u32>>, ApiError> {
        let ctx = model.context_len;
        let vocab = model.vocab_size as u64;
        let ids: Vec<Vec<u32>> = match self {
            Self::Texts(texts) => texts
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    model
                        .tokenizer
                        .encode(t, true)
                        .map_err(|e| bad(format!("input[{i}]: {e}")))
                })
                .collect::<Result<_, _>>()?,
            Self::Tokens(lists) => lists
                .into_iter()
                .enumerate()
                .map(|(i, l)| match l.iter().position(|&t| t >= vocab) {
                    Some(j) => Err(bad(format!(
                        "input[{i}][{j}] = {} is not a token of this model (vocabulary {vocab})",
                        l[j]
                    ))),
                    None => Ok(l.into_iter().map(|t| t as u32).collect()),
                })
                .collect::<Result<_, _>>()?,
        };
        ids.into_iter()
            .enumerate()
            .map(|(i, mut t)| {
                if t.len() <= ctx {
                    return Ok(t);
                }
                if truncate {
                    t.truncate(ctx);
                    return Ok(t);
                }
                Err(bad(format!(
                    "input[{i}] has {} tokens but the context holds {ctx} — shorten it or pass truncate: true",
                    t.len()
                ))
                .with_code("context_length_exceeded"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_every_shape_and_names_what_is_wrong() {
        let p = |v: Value| Inputs::parse(Some(&v), 4);
        assert_eq!(p(json!("a")).unwrap(), Inputs::Texts(vec!["a".into()]));
        assert_eq!(
            p(json!(["a", "b"])).unwrap(),
            Inputs::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(p(json!([1, 2])).unwrap(), Inputs::Tokens(vec![vec![1, 2]]));
        assert_eq!(
            p(json!([[1], [2, 3]])).unwrap(),
            Inputs::Tokens(vec![vec![1], vec![2, 3]])
        );
        let msg = |v: Value| p(v).unwrap_err().message;
        assert!(msg(json!([])).contains("empty list"));
        assert!(msg(json!(["a", 1])).contains("input[1] must be a string"));
        assert!(msg(json!([1, -1])).contains("input[1] must be a token id"));
        assert!(msg(json!([[1], 2])).contains("input[1] must be a list"));
        assert!(msg(json!(["a", ""])).contains("input[1] is empty"));
        assert!(msg(json!({"a": 1})).contains("input must be"));
        assert!(msg(json!(["a", "b", "c", "d", "e"])).contains("at most 4"));
        assert!(
            Inputs::parse(None, 4)
                .unwrap_err()
                .message
                .contains("required")
        );
    }
}
