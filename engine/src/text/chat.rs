//! Chat templates: Hugging Face's Jinja chat templates rendered with minijinja the way transformers renders them.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

/// A message as templates read it; absent tool fields stay undefined, as transformers leaves them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant's calls, read as `message.tool_calls[i].function.name` and `.arguments`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// On a `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` message: the function that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None, name: None }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// `arguments` is the JSON value itself, as transformers passes a dict, so templates can `tojson` it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The model's template itself is broken.
    #[error("chat template does not parse: {0}")]
    Syntax(String),
    /// Rendering failed, usually because the template rejects the conversation via `raise_exception`.
    #[error("chat template failed: {0}")]
    Render(String),
}

/// Renders `template` over `messages` with the globals transformers' `apply_chat_template` provides.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, ChatError> {
    render_chat_with_tools(template, messages, None, add_generation_prompt, bos_token, eos_token)
}

/// As `render_chat`, with `tools` the request's tool list (`{"type": "function", "function": {..}}` each).
pub fn render_chat_with_tools(
    template: &str,
    messages: &[ChatMessage],
    tools: Option<&[serde_json::Value]>,
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, ChatError> {
    let none = serde_json::Map::new();
    render_chat_with_kwargs(template, messages, tools, add_generation_prompt, bos_token, eos_token, &none)
}

/// As `render_chat_with_tools`, with the request's `chat_template_kwargs` (`enable_thinking`, ..) as variables;
/// they cannot replace the variables the render sets itself.
pub fn render_chat_with_kwargs(
    template: &str,
    messages: &[ChatMessage],
    tools: Option<&[serde_json::Value]>,
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, ChatError> {
    let env = environment();
    let source = without_generation_tags(template);
    let compiled = env.template_from_str(&source).map_err(|e| ChatError::Syntax(describe(&e)))?;
    let context = minijinja::context! {
        messages => Value::from_serialize(messages),
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
        // transformers passes these as None when the request has none; templates test `is not none`.
        tools => tools.map_or_else(|| Value::from(()), Value::from_serialize),
        documents => Value::from(()),
        ..Value::from_serialize(kwargs)
    };
    compiled.render(context).map_err(|e| ChatError::Render(describe(&e)))
}

/// An environment configured like transformers' sandboxed Jinja environment.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// The error with its template line, and the cause when there is one.
fn describe(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

/// `{% generation %}` marks assistant spans for training masks; rendering only needs its body.
fn without_generation_tags(template: &str) -> std::borrow::Cow<'_, str> {
    if !template.contains("generation") {
        return template.into();
    }
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out.into();
        };
        let inner = &tag[2..end];
        let open_trim = inner.starts_with('-');
        let close_trim = inner.ends_with('-');
        let word = inner.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(body) => {
                let dash = |on: bool| if on { "-" } else { "" };
                let _ = write!(out, "{{%{} {body} {}%}}", dash(open_trim), dash(close_trim));
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out.into()
}

/// Python's `json.dumps(x, ensure_ascii=False)` with the options transformers' `tojson` exposes, unescaped for HTML.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(v.as_usize().unwrap_or(0)),
        }),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            let fault = "tojson separators must be (item, key)";
            return Err(Error::new(ErrorKind::InvalidOperation, fault));
        }
        // Python drops the space after commas when indenting.
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let mut writer = JsonWriter { out: String::new(), indent, item_sep, key_sep, sort_keys, ensure_ascii };
    writer.value(value, 0)?;
    Ok(Value::from_safe_string(writer.out))
}

struct JsonWriter {
    out: String,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonWriter {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(value),
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                let items =
                    keys.into_iter().map(|k| value.get_item(&k).map(|v| (k, v))).collect::<Result<Vec<_>, _>>()?;
                self.container('{', '}', depth, items, |w, (k, v), depth| {
                    w.string(&k.to_string());
                    let sep = std::mem::take(&mut w.key_sep);
                    w.out.push_str(&sep);
                    w.key_sep = sep;
                    w.value(&v, depth)
                })?;
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container('[', ']', depth, items, |w, v, depth| w.value(&v, depth))?;
            }
            _ => self.string(&value.to_string()),
        }
        Ok(())
    }

    fn container<T>(
        &mut self,
        open: char,
        close: char,
        depth: usize,
        items: Vec<T>,
        mut write_item: impl FnMut(&mut Self, T, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        let is_empty = items.is_empty();
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                let sep = std::mem::take(&mut self.item_sep);
                self.out.push_str(&sep);
                self.item_sep = sep;
            }
            self.newline(depth + 1);
            write_item(self, item, depth + 1)?;
        }
        if !is_empty {
            self.newline(depth);
        }
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn number(&mut self, value: &Value) {
        if value.is_integer() {
            let _ = write!(self.out, "{value}");
            return;
        }
        let float = f64::try_from(value.clone()).unwrap_or(f64::NAN);
        if float.is_nan() {
            self.out.push_str("NaN");
        } else if float.is_infinite() {
            self.out.push_str(if float > 0.0 { "Infinity" } else { "-Infinity" });
        } else if float.fract() == 0.0 && float.abs() < 1e16 {
            let _ = write!(self.out, "{float:.1}");
        } else {
            let _ = write!(self.out, "{float}");
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{08}' => self.out.push_str("\\b"),
                '\u{0C}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/// Python's `datetime.now().strftime(format)` for the directives chat templates use, in UTC.
fn strftime_now(format: String) -> String {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    strftime(&format, seconds)
}

fn strftime(format: &str, unix_seconds: i64) -> String {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = (days + 4).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('B') => write!(out, "{month_name}"),
            Some('b') | Some('h') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{}", WEEKDAYS[weekday]),
            Some('a') => write!(out, "{}", &WEEKDAYS[weekday][..3]),
            Some('w') => write!(out, "{weekday}"),
            Some('j') => write!(out, "{day_of_year:03}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('F') => write!(out, "{year}-{month:02}-{day:02}"),
            Some('T') => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01, proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    /// Leans on trim/lstrip blocks, loop controls, namespace, Python string methods and tojson.
    const FEATURES: &str = r#"{{ bos_token }}
{%- set ns = namespace(count=0) %}
{% for message in messages %}
    {% if message.role == 'system' %}
        {% continue %}
    {% endif %}
    {% set ns.count = ns.count + 1 %}
[{{ loop.index }}] {{ message['role'].upper() }}: {{ message.content.strip() | tojson }}
    {% if message.content.startswith('stop') %}{% break %}{% endif %}
{% endfor %}
{{ ns.count }} shown{{ eos_token }}
{% if add_generation_prompt %}
ASSISTANT:
{% endif %}"#;

    fn messages(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs.iter().map(|(role, content)| ChatMessage::new(*role, *content)).collect()
    }

    fn render(template: &str, pairs: &[(&str, &str)]) -> Result<String, ChatError> {
        render_chat(template, &messages(pairs), true, "<s>", "</s>")
    }

    // Expected strings come from transformers' render_jinja_template (tools/tokenizer_corpus.py).
    #[test]
    fn test_chatml_matches_transformers() {
        let conversation = [
            ("system", "Answer in French."),
            ("user", "Hi there"),
            ("assistant", "Bonjour !"),
            ("user", "How are you? 😀\nTwo lines."),
        ];
        let expected = "<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nBonjour !<|im_end|>\n<|im_start|>user\nHow are you? 😀\nTwo lines.<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(render(CHATML, &conversation).unwrap(), expected);
    }

    #[test]
    fn test_blocks_loops_and_methods_match_transformers() {
        let conversation = [
            ("system", "hidden"),
            ("user", "  Hi \"there\" <b> ünï  "),
            ("assistant", "Hello"),
            ("user", "stop here"),
            ("assistant", "never shown"),
        ];
        let expected = "<s>[2] USER: \"Hi \\\"there\\\" <b> ünï\"\n[3] ASSISTANT: \"Hello\"\n[4] USER: \"stop here\"\n3 shown</s>\nASSISTANT:\n";
        assert_eq!(render(FEATURES, &conversation).unwrap(), expected);
    }

    #[test]
    fn test_tojson_formats_like_python_json_dumps() {
        let flat = r#"{{ {"a": [1, 2.5, none, true, 3.0], "b": "x\"y\n<é>\t"} | tojson }}"#;
        let expected = "{\"a\": [1, 2.5, null, true, 3.0], \"b\": \"x\\\"y\\n<é>\\t\"}";
        assert_eq!(render(flat, &[]).unwrap(), expected);
        let nested = r#"{{ {"a": [1, {"c": []}], "b": {}} | tojson(indent=2) }}"#;
        let expected = "{\n  \"a\": [\n    1,\n    {\n      \"c\": []\n    }\n  ],\n  \"b\": {}\n}";
        assert_eq!(render(nested, &[]).unwrap(), expected);
        let methods = r#"{{ "a,b".split(",") | tojson }}|{{ " x ".strip() }}|{{ "Hi".lower() }}"#;
        assert_eq!(render(methods, &[]).unwrap(), "[\"a\", \"b\"]|x|hi");
    }

    #[test]
    fn test_tools_and_documents_are_none() {
        let template = "{% if tools is not none %}T{% endif %}{% if documents is none %}D{% endif %}";
        assert_eq!(render(template, &[]).unwrap(), "D");
    }

    #[test]
    fn test_template_kwargs_are_variables_but_cannot_replace_the_render_s_own() {
        let template = "{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}\
            {{ messages | length }}";
        let kwargs = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
        let messages = [ChatMessage::new("user", "hi")];
        let off = kwargs(serde_json::json!({"enable_thinking": false, "messages": []}));
        let render = |kw| render_chat_with_kwargs(template, &messages, None, true, "", "", kw).unwrap();
        assert_eq!(render(&off), "off1");
        assert_eq!(render(&kwargs(serde_json::json!({}))), "on1");
    }

    #[test]
    fn test_generation_tags_render_their_body() {
        let template = "{% for m in messages %}{%- generation -%} {{ m.content }}{% endgeneration %}{% endfor %}";
        assert_eq!(render(template, &[("user", "hi")]).unwrap(), "hi");
    }

    #[test]
    fn test_raise_exception_is_a_render_error_with_its_message() {
        let template = "{% if messages[0].role != 'system' %}{{ raise_exception('roles must alternate') }}{% endif %}";
        let err = render(template, &[("user", "hi")]).unwrap_err();
        assert!(matches!(&err, ChatError::Render(m) if m.contains("roles must alternate")), "{err}");
    }

    #[test]
    fn test_broken_template_is_a_syntax_error() {
        let err = render("{% for m in messages %}{{ m.content }}", &[]).unwrap_err();
        assert!(matches!(err, ChatError::Syntax(_)), "{err}");
    }

    #[test]
    fn test_strftime_matches_python_directives() {
        // 2024-02-29T13:05:09Z, a Thursday.
        let at = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", at), "29 Feb 2024");
        assert_eq!(strftime("%A %B %e, %y %j", at), "Thursday February 29, 24 060");
        assert_eq!(strftime("%H:%M:%S %I%p %F %T %% %Q", at), "13:05:09 01PM 2024-02-29 13:05:09 % %Q");
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d", -86_400), "1969-12-31");
        assert!(!strftime_now("%Y".into()).is_empty());
    }
}
