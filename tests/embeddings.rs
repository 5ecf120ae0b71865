//! `POST /v1/embeddings` end to end on the default model (SmolLM2-135M, hidden size 576): the vector's shape and
//! encodings, batches equal to each input alone, similarity, and the 400s.

mod common;

use base64::Engine as _;
use common::server::{Response, Server};
use serde_json::{json, Value};

const EMBEDDINGS: &str = "/v1/embeddings";
const HIDDEN_SIZE: usize = 576;

fn embed(server: &Server, input: Value, extra: Value) -> Response {
    let mut body = json!({"model": server.model, "input": input});
    body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    server.post_json(EMBEDDINGS, &body)
}

/// Each vector of a reply, decoded from floats or base64 as the reply holds it, as f32 bits.
fn vectors(response: &Response) -> Vec<Vec<u32>> {
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    assert_eq!(json["object"], "list", "{json}");
    let data = json["data"].as_array().expect("data").clone();
    let decode = |(i, item): (usize, &Value)| {
        assert_eq!(item["object"], "embedding");
        assert_eq!(item["index"], i);
        match &item["embedding"] {
            Value::String(text) => {
                let bytes = base64::engine::general_purpose::STANDARD.decode(text).expect("base64");
                bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect()
            }
            Value::Array(floats) => floats.iter().map(|v| (v.as_f64().expect("a number") as f32).to_bits()).collect(),
            other => panic!("not an embedding: {other}"),
        }
    };
    data.iter().enumerate().map(decode).collect()
}

fn floats(bits: &[u32]) -> Vec<f64> {
    bits.iter().map(|b| f32::from_bits(*b) as f64).collect()
}

fn cosine(a: &[u32], b: &[u32]) -> f64 {
    floats(a).iter().zip(floats(b)).map(|(x, y)| x * y).sum()
}

#[test]
fn test_float_and_base64_give_the_same_unit_vector_of_the_hidden_size() {
    let server = Server::start(&[]);
    let input = json!("The quick brown fox jumps over the lazy dog.");
    let float = embed(&server, input.clone(), json!({}));
    let json = float.json();
    assert_eq!(json["model"], server.model, "{json}");
    let tokens = json["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(tokens > 5, "{json}");
    assert_eq!(json["usage"]["total_tokens"], tokens, "{json}");
    let float = vectors(&float);
    let base64 = vectors(&embed(&server, input.clone(), json!({"encoding_format": "base64", "user": "u1"})));
    assert_eq!(float.len(), 1);
    assert_eq!(float[0].len(), HIDDEN_SIZE);
    let norm = floats(&float[0]).iter().map(|v| v * v).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    // JSON floats carry f32's shortest form; base64 carries the bits.
    assert!(floats(&float[0]).iter().zip(floats(&base64[0])).all(|(a, b)| (a - b).abs() <= 1e-7));
    let sized = embed(&server, input, json!({"dimensions": HIDDEN_SIZE, "encoding_format": "base64"}));
    assert_eq!(vectors(&sized), base64, "the same request again, with the model's own dimensions");
}

#[test]
fn test_a_batch_equals_each_input_alone_bit_for_bit() {
    let server = Server::start(&["--round-tokens", "16"]);
    let inputs = [
        json!("Paris is the capital of France."),
        json!("A short one."),
        json!([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27]),
        json!("Embeddings of a longer sentence, which takes more than one round of sixteen tokens to prefill here."),
    ];
    let base64 = json!({"encoding_format": "base64"});
    let alone: Vec<Vec<u32>> =
        inputs.iter().map(|i| vectors(&embed(&server, i.clone(), base64.clone())).remove(0)).collect();
    let batch = vectors(&embed(&server, json!([inputs[0], inputs[1], inputs[3]]), base64.clone()));
    assert_eq!(batch, vec![alone[0].clone(), alone[1].clone(), alone[3].clone()]);
    let id_lists = vectors(&embed(&server, json!([inputs[2], inputs[2]]), base64.clone()));
    assert_eq!(id_lists, vec![alone[2].clone(), alone[2].clone()]);
    // Beside a chat request decoding in the same rounds.
    let chat = json!({"model": server.model, "messages": [{"role": "user", "content": "Count to twenty."}],
        "max_tokens": 48, "temperature": 0, "stream": true});
    let mut stream = server.stream("/v1/chat/completions", &chat);
    stream.next_data().expect("the chat's first chunk");
    let beside = vectors(&embed(&server, json!([inputs[3], inputs[0]]), base64));
    assert_eq!(beside, vec![alone[3].clone(), alone[0].clone()]);
    stream.collect_data().expect("the chat's rest");
}

#[test]
fn test_similar_sentences_are_closer_than_unrelated_ones() {
    let server = Server::start(&[]);
    let sentences =
        json!(
            ["The cat sat on the mat.", "A cat was sitting on the mat.", "Quarterly revenue rose by eight percent.",]
        );
    let v = vectors(&embed(&server, sentences, json!({"encoding_format": "base64"})));
    let (similar, unrelated) = (cosine(&v[0], &v[1]), cosine(&v[0], &v[2]));
    assert!(similar > unrelated, "similar {similar}, unrelated {unrelated}");
}

#[test]
fn test_bad_embedding_requests_are_400s_naming_the_field() {
    let server = Server::start(&[]);
    let param = |response: Response, status: u16| {
        assert_eq!(response.status, status, "{}", response.text());
        response.json()["error"]["param"].clone()
    };
    for input in [json!(""), json!([]), json!([""]), json!([[]]), json!(["a", 3]), json!(7), json!([1u64 << 40])] {
        assert_eq!(param(embed(&server, input.clone(), json!({})), 400), "input", "{input}");
    }
    assert_eq!(param(embed(&server, json!(vec!["a"; 65]), json!({})), 400), "input");
    assert_eq!(param(embed(&server, json!([100_000_000]), json!({})), 400), "input");
    let long = embed(&server, json!(vec![1; 200_000]), json!({}));
    assert_eq!(long.status, 400, "{}", long.text());
    assert_eq!(long.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(param(embed(&server, json!("a"), json!({"encoding_format": "int8"})), 400), "encoding_format");
    assert_eq!(param(embed(&server, json!("a"), json!({"dimensions": 64})), 400), "dimensions");
    let no_input = server.post_json(EMBEDDINGS, &json!({"model": server.model}));
    assert_eq!(param(no_input, 400), "input");
    let get = server.get(EMBEDDINGS);
    assert_eq!(get.status, 405, "{}", get.text());
    // The default voice is a speech model: it cannot embed, nor write text, on any text route alike.
    let models = server.get("/v1/models").json();
    let voice = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .find(|id| *id != server.model);
    let voice = voice.expect("the default voice is served beside the text model");
    let chat = json!({"model": voice, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2});
    let completion = json!({"model": voice, "prompt": "hello", "max_tokens": 2});
    let embedding = json!({"model": voice, "input": "hello"});
    for (route, body) in [(EMBEDDINGS, embedding), ("/v1/chat/completions", chat), ("/v1/completions", completion)] {
        let response = server.post_json(route, &body);
        assert_eq!(response.status, 400, "{route}: {}", response.text());
        assert_eq!(response.json()["error"]["code"], "model_not_supported", "{route}");
        assert!(response.json()["error"]["message"].as_str().unwrap().contains("runs speech"), "{route}");
    }
    // No name, or any other, stands for the text model on every text route.
    let unnamed = server.post_json(EMBEDDINGS, &json!({"input": "hello"}));
    assert_eq!(unnamed.status, 200, "{}", unnamed.text());
}
