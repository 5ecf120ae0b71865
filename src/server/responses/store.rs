//! Stored responses in one SQLite file: kept across restarts, bounded by size and age, read only by the key
//! that made them.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use crate::server::error::ApiError;

/// How much the store keeps: the newest responses within `max_bytes`, none older than `max_age_secs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    pub max_bytes: u64,
    pub max_age_secs: u64,
}

/// One stored response.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub id: String,
    pub created_at: u64,
    /// The response object as last reported.
    pub response: Value,
    /// The request's own input items.
    pub input_items: Vec<Value>,
    /// The whole conversation after this response, as items: what `previous_response_id` continues.
    pub history: Vec<Value>,
}

/// The store, or nothing when storing is off.
pub struct Store {
    db: Option<Mutex<Connection>>,
    limits: StoreLimits,
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    history TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created_at);";

/// Background responses a stopped server left running are over: failed, saying why.
const ORPHANS: &str = "UPDATE responses SET response = json_set(response, '$.status', 'failed', '$.error',
    json_object('code', 'server_error', 'message', 'the server stopped before this background response finished'))
    WHERE json_extract(response, '$.status') IN ('queued', 'in_progress')";

fn failed(doing: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(format!("the response store failed {doing}: {e}"))
}

impl Store {
    /// The store at `path`, made if absent.
    pub fn open(path: &Path, limits: StoreLimits) -> Result<Store, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
        }
        let open = || -> rusqlite::Result<Connection> {
            let db = Connection::open(path)?;
            db.busy_timeout(std::time::Duration::from_secs(10))?;
            db.execute_batch(SCHEMA)?;
            db.execute(ORPHANS, [])?;
            Ok(db)
        };
        let db = open().map_err(|e| format!("opening the response store {}: {e}", path.display()))?;
        Ok(Store { db: Some(Mutex::new(db)), limits })
    }

    /// A store that keeps nothing.
    pub fn off() -> Store {
        Store { db: None, limits: StoreLimits { max_bytes: 0, max_age_secs: 0 } }
    }

    pub fn is_on(&self) -> bool {
        self.db.is_some()
    }

    fn with<T>(
        &self,
        doing: &str,
        run: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<Option<T>, ApiError> {
        let Some(db) = &self.db else { return Ok(None) };
        let db = db.lock().map_err(|_| failed(doing, "a writer panicked"))?;
        run(&db).map(Some).map_err(|e| failed(doing, e))
    }

    /// Writes `record` for `owner`, replacing an earlier version, then drops what the limits no longer allow.
    pub fn put(&self, owner: &str, record: &Record, now: u64) -> Result<(), ApiError> {
        let list = |items: &[Value]| Value::from(items.to_vec()).to_string();
        let (response, input, history) =
            (record.response.to_string(), list(&record.input_items), list(&record.history));
        let size = (response.len() + input.len() + history.len()) as i64;
        let limits = self.limits;
        self.with("writing", |db| {
            db.execute(
                "INSERT OR REPLACE INTO responses (id, owner, created_at, response, input_items, history, size)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![record.id, owner, record.created_at as i64, response, input, history, size],
            )?;
            let oldest = now.saturating_sub(limits.max_age_secs) as i64;
            db.execute("DELETE FROM responses WHERE created_at < ?1", params![oldest])?;
            db.execute(
                "DELETE FROM responses WHERE rowid IN (SELECT rowid FROM (SELECT rowid, SUM(size) OVER
                 (ORDER BY created_at DESC, rowid DESC) AS kept FROM responses) WHERE kept > ?1)",
                params![limits.max_bytes as i64],
            )?;
            Ok(())
        })?;
        Ok(())
    }

    /// `owner`'s response `id`; another owner's is as absent as one never made.
    pub fn get(&self, owner: &str, id: &str) -> Result<Option<Record>, ApiError> {
        let row = self.with("reading", |db| {
            db.query_row(
                "SELECT created_at, response, input_items, history FROM responses WHERE id = ?1 AND owner = ?2",
                params![id, owner],
                |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                    ))
                },
            )
            .optional()
        })?;
        let Some((created_at, response, input, history)) = row.flatten() else { return Ok(None) };
        let parse = |text: &str| serde_json::from_str(text).map_err(|e| failed("reading", e));
        let list = |text: &str| serde_json::from_str::<Vec<Value>>(text).map_err(|e| failed("reading", e));
        Ok(Some(Record {
            id: id.to_string(),
            created_at: created_at as u64,
            response: parse(&response)?,
            input_items: list(&input)?,
            history: list(&history)?,
        }))
    }

    /// Removes `owner`'s response `id`; whether there was one.
    pub fn delete(&self, owner: &str, id: &str) -> Result<bool, ApiError> {
        let removed = self.with("deleting", |db| {
            db.execute("DELETE FROM responses WHERE id = ?1 AND owner = ?2", params![id, owner])
        })?;
        Ok(removed.unwrap_or(0) > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(id: &str, created_at: u64, filler: usize) -> Record {
        Record {
            id: id.into(),
            created_at,
            response: json!({"id": id, "pad": "x".repeat(filler)}),
            input_items: vec![json!({"type": "message", "role": "user", "content": "hi"})],
            history: Vec::new(),
        }
    }

    fn store(dir: &Path, max_bytes: u64) -> Store {
        Store::open(&dir.join("responses.sqlite3"), StoreLimits { max_bytes, max_age_secs: 100 }).expect("opens")
    }

    #[test]
    fn test_a_record_survives_reopening_and_only_its_owner_reads_it() {
        let dir = tempfile::tempdir().expect("a directory");
        store(dir.path(), 1 << 20).put("alice", &record("resp_1", 10, 0), 10).expect("written");
        let reopened = store(dir.path(), 1 << 20);
        assert_eq!(reopened.get("alice", "resp_1").expect("read"), Some(record("resp_1", 10, 0)));
        assert_eq!(reopened.get("bob", "resp_1").expect("read"), None);
        assert!(!reopened.delete("bob", "resp_1").expect("delete runs"));
        assert!(reopened.delete("alice", "resp_1").expect("delete runs"));
        assert_eq!(reopened.get("alice", "resp_1").expect("read"), None);
    }

    #[test]
    fn test_the_oldest_go_first_past_the_size_and_age_limits() {
        let dir = tempfile::tempdir().expect("a directory");
        let store = store(dir.path(), 2500);
        for (i, at) in [(1, 10), (2, 20), (3, 30)] {
            store.put("a", &record(&format!("resp_{i}"), at, 1000), at).expect("written");
        }
        assert_eq!(store.get("a", "resp_1").expect("read"), None, "over the size limit");
        assert!(store.get("a", "resp_2").expect("read").is_some());
        store.put("a", &record("resp_4", 125, 0), 125).expect("written");
        assert_eq!(store.get("a", "resp_2").expect("read"), None, "past the age limit");
        assert!(store.get("a", "resp_3").expect("read").is_some());
    }

    #[test]
    fn test_a_background_response_left_running_is_failed_on_reopening() {
        let dir = tempfile::tempdir().expect("a directory");
        let mut running = record("resp_1", 10, 0);
        running.response = json!({"id": "resp_1", "status": "queued", "error": null});
        store(dir.path(), 1 << 20).put("a", &running, 10).expect("written");
        let reopened = store(dir.path(), 1 << 20).get("a", "resp_1").expect("read").expect("kept");
        assert_eq!(reopened.response["status"], "failed");
        assert_eq!(reopened.response["error"]["code"], "server_error");
    }

    #[test]
    fn test_an_off_store_keeps_nothing() {
        let store = Store::off();
        store.put("a", &record("resp_1", 1, 0), 1).expect("no error");
        assert_eq!(store.get("a", "resp_1").expect("no error"), None);
    }
}
