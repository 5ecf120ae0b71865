//! What shapes a lane's draws beyond sampling: logit bias, presence and frequency penalties, and the grammar
//! a `response_format` compiles to.

use serde_json::{Map, Value};
use tensorfold_engine::boundary::{Constraint, LogitRules};
use tensorfold_engine::text::grammar::{GrammarSpec, Grammars};

use crate::server::error::ApiError;

/// Most `logit_bias` entries one request may carry, as OpenAI allows.
const MAX_LOGIT_BIAS: usize = 300;
const BIAS_RANGE: std::ops::RangeInclusive<f64> = -100.0..=100.0;
const PENALTY_RANGE: std::ops::RangeInclusive<f32> = -2.0..=2.0;

/// What the reply's text must be.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    /// A JSON document under the schema; `name` and `strict` are taken and not otherwise used.
    JsonSchema(Value),
}

impl ResponseFormat {
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}`.
    pub fn parse(value: Value) -> Result<ResponseFormat, ApiError> {
        let invalid = |message: &str| ApiError::invalid("response_format", message.to_string());
        let Value::Object(mut format) = value else {
            return Err(invalid("'response_format' must be an object with a 'type'"));
        };
        match format.get("type").and_then(Value::as_str) {
            Some("text") => Ok(ResponseFormat::Text),
            Some("json_object") => Ok(ResponseFormat::JsonObject),
            Some("json_schema") => {
                let Some(Value::Object(mut inner)) = format.remove("json_schema") else {
                    return Err(invalid("'response_format.json_schema' must be an object with a 'schema'"));
                };
                match inner.remove("schema").filter(|s| !s.is_null()) {
                    Some(schema @ (Value::Object(_) | Value::Bool(_))) => Ok(ResponseFormat::JsonSchema(schema)),
                    Some(_) => Err(invalid("'response_format.json_schema.schema' must be a JSON schema object")),
                    None => Ok(ResponseFormat::JsonObject),
                }
            }
            Some(other) => Err(invalid(&format!(
                "response_format type '{other}' is not supported; use text, json_object or json_schema"
            ))),
            None => Err(invalid("'response_format.type' must be a string")),
        }
    }

    /// The grammar this format asks for; `None` for free text.
    pub fn spec(&self) -> Option<GrammarSpec> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(GrammarSpec::JsonObject),
            ResponseFormat::JsonSchema(schema) => Some(GrammarSpec::JsonSchema(schema.clone())),
        }
    }
}

/// One lane's constraint for `spec`; a grammar that does not compile is the client's 400.
pub fn constraint(grammars: &Grammars, spec: &GrammarSpec) -> Result<Box<dyn Constraint>, ApiError> {
    grammars.compile(spec).map_err(|e| ApiError::invalid("response_format", e.to_string()))
}

/// Checks the ranges and the vocabulary; bias entries come out in id order.
pub fn logit_rules(
    presence: Option<f32>,
    frequency: Option<f32>,
    bias: Option<&Map<String, Value>>,
    vocab: usize,
) -> Result<LogitRules, ApiError> {
    let penalty = |param: &str, value: Option<f32>| match value {
        Some(v) if !PENALTY_RANGE.contains(&v) => {
            Err(ApiError::invalid(param, format!("'{param}' must be in [-2, 2], got {v}")))
        }
        v => Ok(v.unwrap_or(0.0)),
    };
    let presence = penalty("presence_penalty", presence)?;
    let frequency = penalty("frequency_penalty", frequency)?;
    let bias = bias.map(|map| logit_bias(map, vocab)).transpose()?.unwrap_or_default();
    Ok(LogitRules { bias, presence, frequency })
}

fn logit_bias(map: &Map<String, Value>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let invalid = |message: String| ApiError::invalid("logit_bias", message);
    if map.len() > MAX_LOGIT_BIAS {
        return Err(invalid(format!("'logit_bias' may hold at most {MAX_LOGIT_BIAS} entries, got {}", map.len())));
    }
    let mut bias = map
        .iter()
        .map(|(key, value)| {
            let id = key
                .trim()
                .parse::<u32>()
                .map_err(|_| invalid(format!("'logit_bias' keys must be token ids, got '{key}'")))?;
            if id as usize >= vocab {
                return Err(invalid(format!("logit_bias token id {id} is outside the vocabulary of {vocab}")));
            }
            match value.as_f64() {
                Some(v) if BIAS_RANGE.contains(&v) => Ok((id, v as f32)),
                _ => Err(invalid(format!("logit_bias[{key}] must be a number in [-100, 100], got {value}"))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    bias.sort_unstable_by_key(|&(id, _)| id);
    Ok(bias)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_and_message(result: Result<impl std::fmt::Debug, ApiError>) -> (String, String) {
        match result {
            Err(e @ ApiError::InvalidRequest { .. }) => {
                let body = e.body().error;
                (body.param.unwrap_or_default(), body.message)
            }
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    fn bias(value: Value) -> Result<LogitRules, ApiError> {
        logit_rules(None, None, value.as_object(), 10)
    }

    #[test]
    fn test_logit_bias_is_sorted_by_id() {
        let rules = bias(serde_json::json!({"7": -100, "2": 5.5, " 3": 100})).expect("valid");
        assert_eq!(rules.bias, [(2, 5.5), (3, 100.0), (7, -100.0)]);
        assert_eq!((rules.presence, rules.frequency), (0.0, 0.0));
    }

    #[test]
    fn test_each_bad_logit_bias_names_the_field() {
        let too_many: Map<String, Value> = (0..301).map(|i| (i.to_string(), Value::from(1))).collect();
        let cases = [
            (serde_json::json!({"x": 1}), "token ids"),
            (serde_json::json!({"-1": 1}), "token ids"),
            (serde_json::json!({"10": 1}), "outside the vocabulary of 10"),
            (serde_json::json!({"1": 100.5}), "[-100, 100]"),
            (serde_json::json!({"1": "5"}), "[-100, 100]"),
            (Value::Object(too_many), "at most 300"),
        ];
        for (value, expected) in cases {
            let vocab = if value.as_object().is_some_and(|m| m.len() > 300) { 1000 } else { 10 };
            let (param, message) = param_and_message(logit_rules(None, None, value.as_object(), vocab));
            assert_eq!(param, "logit_bias", "{value}");
            assert!(message.contains(expected), "{value}: {message}");
        }
    }

    #[test]
    fn test_penalties_are_in_range() {
        let rules = logit_rules(Some(-2.0), Some(1.5), None, 10).expect("valid");
        assert_eq!((rules.presence, rules.frequency), (-2.0, 1.5));
        assert_eq!(param_and_message(logit_rules(Some(2.5), None, None, 10)).0, "presence_penalty");
        assert_eq!(param_and_message(logit_rules(None, Some(-2.1), None, 10)).0, "frequency_penalty");
    }

    #[test]
    fn test_response_formats_parse() {
        let parse = ResponseFormat::parse;
        assert_eq!(parse(serde_json::json!({"type": "text"})).expect("text"), ResponseFormat::Text);
        assert_eq!(parse(serde_json::json!({"type": "json_object"})).expect("object"), ResponseFormat::JsonObject);
        let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let format = serde_json::json!({"type": "json_schema",
            "json_schema": {"name": "thing", "schema": schema, "strict": true}});
        assert_eq!(parse(format).expect("schema"), ResponseFormat::JsonSchema(schema));
        for bad in [
            serde_json::json!({"type": "xml"}),
            serde_json::json!({}),
            serde_json::json!("json"),
            serde_json::json!({"type": "json_schema"}),
            serde_json::json!({"type": "json_schema", "json_schema": {"schema": 3}}),
        ] {
            assert_eq!(param_and_message(parse(bad.clone())).0, "response_format", "{bad}");
        }
    }
}
