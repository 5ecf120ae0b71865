//! `GET /openapi.json`: the API's OpenAPI description, `docs/openapi.yaml`, served as JSON.

use std::sync::OnceLock;

use actix_web::HttpResponse;
use serde_json::Value;

use super::error::ApiError;

const DOCUMENT: &str = include_str!("../../docs/openapi.yaml");

/// The document as JSON, parsed on first use.
pub fn document() -> Result<&'static Value, ApiError> {
    static PARSED: OnceLock<Result<Value, String>> = OnceLock::new();
    let parsed = PARSED.get_or_init(|| yaml_serde::from_str(DOCUMENT).map_err(|e| e.to_string()));
    parsed.as_ref().map_err(|e| ApiError::Internal(format!("docs/openapi.yaml: {e}")))
}

/// Every (path, method) the document describes, methods upper-case, path templates as written.
pub fn operations(document: &Value) -> Vec<(String, String)> {
    let paths = document["paths"].as_object().into_iter().flatten();
    let methods = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
    let of_path = |(path, item): (&String, &Value)| {
        let item = item.as_object().cloned().unwrap_or_default();
        let served = methods.iter().filter(|m| item.contains_key(**m));
        served.map(|m| (path.clone(), m.to_uppercase())).collect::<Vec<_>>()
    };
    let mut operations: Vec<_> = paths.flat_map(of_path).collect();
    operations.sort();
    operations
}

pub(super) async fn openapi() -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(document()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::routes::ROUTES;

    #[test]
    fn test_the_document_is_openapi_3_1_and_describes_exactly_the_served_routes() {
        let document = document().unwrap();
        assert_eq!(document["openapi"], "3.1.0");
        let mut served: Vec<_> = ROUTES.iter().map(|(p, m)| (p.to_string(), m.to_string())).collect();
        served.sort();
        assert_eq!(operations(document), served);
    }
}
