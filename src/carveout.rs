//! The carveout: KV room lent by another process. Every caller makes the same two calls: `requested` reads the
//! settings, `open` claims from the source they name and logs a refusal once; a refusal is never fatal.

use std::path::PathBuf;

use tensorfold_lend::{claim, claim_drm, Claim, KeySource, Lent};

use crate::settings::{setting, Key, Settings};

/// Where lent memory is to come from, as the settings say.
#[derive(Clone, Debug)]
pub enum Source {
    Daemon(Claim),
    Drm { ask_bytes: u64 },
}

/// A carveout the settings ask for.
#[derive(Clone, Debug)]
pub struct Request {
    pub source: Source,
}

/// The carveout the settings ask for, or `None` while `TF_CARVEOUT` is 0; the key file is not read here.
pub fn requested(settings: &Settings) -> Option<Request> {
    if !settings.is_on(Key::Carveout) {
        return None;
    }
    let ask_bytes = settings.count(Key::CarveoutMib).expect("the table gives it a default") << 20;
    let source = match settings.text(Key::CarveoutSource) {
        Some("drm") => Source::Drm { ask_bytes },
        _ => {
            let name = |key| setting(key).name();
            let key = match (settings.text(Key::CarveoutKey), settings.path(Key::CarveoutKeyFile)) {
                (Some(key), _) => KeySource::Inline { key: key.to_string(), setting: name(Key::CarveoutKey) },
                (None, Some(path)) => KeySource::File { path: path.to_path_buf(), setting: name(Key::CarveoutKeyFile) },
                // The table refuses this at start-up; an empty key is refused again at the claim.
                (None, None) => KeySource::Inline { key: String::new(), setting: name(Key::CarveoutKey) },
            };
            let socket = settings.path(Key::CarveoutSocket).map_or_else(PathBuf::new, |p| p.to_path_buf());
            Source::Daemon(Claim::new(socket, key, ask_bytes))
        }
    };
    Some(Request { source })
}

/// Claims the memory `request` names; on a refusal, logs why in one line and gives `None`.
pub fn open(request: &Request) -> Option<Lent> {
    match claim_for(request) {
        Ok(lent) => {
            tracing::info!(source = lent.source(), lent_bytes = lent.bytes(), "carveout: memory lent");
            Some(lent)
        }
        Err(why) => {
            tracing::warn!("carveout refused, starting with the ordinary KV room: {why}");
            None
        }
    }
}

fn claim_for(request: &Request) -> Result<Lent, String> {
    match &request.source {
        Source::Daemon(c) => claim(c).map_err(|e| e.to_string()),
        Source::Drm { ask_bytes } => claim_drm(*ask_bytes).map_err(|e| e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tensorfold_lend::daemon::{Daemon, Running};
    use tensorfold_lend::pool::MemfdPool;

    use super::*;
    use crate::settings::SettingError;

    fn resolve(env: &[(&str, &str)]) -> Result<Settings, SettingError> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::resolve(&[], &|name| env.get(name).cloned())
    }

    #[test]
    fn test_the_carveout_rows_are_validated_only_while_the_carveout_is_on() {
        let bad = [("TF_CARVEOUT_SOURCE", "tape"), ("TF_CARVEOUT_MIB", "0"), ("TF_CARVEOUT_KEY_FILE", "/k")];
        let off = resolve(&bad).expect("rows behind the carveout are not read while it is off");
        assert!(requested(&off).is_none());
        assert!(off.render().contains("(not used: TF_CARVEOUT is 0)"));
        let refused = |env: &[(&str, &str)]| resolve(env).expect_err("refused").to_string();
        let on = ("TF_CARVEOUT", "1");
        assert_eq!(refused(&[on, bad[0]]), "TF_CARVEOUT_SOURCE: must be one of daemon, drm, not \"tape\"");
        assert_eq!(refused(&[on, bad[1]]), "TF_CARVEOUT_MIB: must be between 1 and 16777216, not 0");
        assert_eq!(refused(&[("TF_CARVEOUT", "yes")]), "TF_CARVEOUT: must be 0 or 1, not \"yes\"");
        assert_eq!(refused(&[on]), "TF_CARVEOUT_KEY: the daemon source needs TF_CARVEOUT_KEY or TF_CARVEOUT_KEY_FILE");
        let both = [on, ("TF_CARVEOUT_KEY", "k"), ("TF_CARVEOUT_KEY_FILE", "/k")];
        assert_eq!(refused(&both), "TF_CARVEOUT_KEY: set TF_CARVEOUT_KEY or TF_CARVEOUT_KEY_FILE, not both");
        // The daemon's rows are not read for the drm source.
        let drm = resolve(&[on, ("TF_CARVEOUT_SOURCE", "drm"), ("TF_CARVEOUT_KEY", "k"), bad[2]]).unwrap();
        assert!(matches!(requested(&drm).unwrap().source, Source::Drm { ask_bytes } if ask_bytes == 1 << 30));
    }

    #[test]
    fn test_a_request_reads_its_rows_and_a_secret_key_is_never_printed() {
        let s = resolve(&[("TF_CARVEOUT", "1"), ("TF_CARVEOUT_KEY", "hunter2"), ("TF_CARVEOUT_MIB", "3")]).unwrap();
        let Source::Daemon(c) = requested(&s).unwrap().source else { panic!("the daemon is the default source") };
        assert_eq!((c.socket, c.ask_bytes), (PathBuf::from("/run/tensorfold/lend.sock"), 3 << 20));
        assert!(!s.render().contains("hunter2"));
        assert!(!format!("{:?}", requested(&s)).contains("hunter2"));
    }

    #[test]
    fn test_a_refusal_is_not_fatal_and_the_drm_source_never_reads_the_key_file() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("none.sock");
        let socket = socket.to_str().unwrap();
        let s = resolve(&[("TF_CARVEOUT", "1"), ("TF_CARVEOUT_KEY", "k"), ("TF_CARVEOUT_SOCKET", socket)]).unwrap();
        assert!(open(&requested(&s).unwrap()).is_none(), "no daemon: a refusal, not an error");
        let missing = dir.path().join("no-key-file");
        let drm =
            [("TF_CARVEOUT", "1"), ("TF_CARVEOUT_SOURCE", "drm"), ("TF_CARVEOUT_KEY_FILE", missing.to_str().unwrap())];
        let request = requested(&resolve(&drm).unwrap()).unwrap();
        let why = claim_for(&request).err().unwrap();
        assert!(why.contains("display card") && !why.contains("TF_CARVEOUT_KEY_FILE"), "{why}");
    }

    #[test]
    fn test_open_claims_from_the_daemon_the_settings_name() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("lend.sock");
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, "sesame\n").unwrap();
        let daemon = Daemon::bind(&socket, b"sesame".to_vec(), Box::new(MemfdPool::new(4))).unwrap();
        let _daemon = Running::start(daemon).unwrap();
        let env = [
            ("TF_CARVEOUT", "1"),
            ("TF_CARVEOUT_MIB", "5"),
            ("TF_CARVEOUT_SOCKET", socket.to_str().unwrap()),
            ("TF_CARVEOUT_KEY_FILE", key_file.to_str().unwrap()),
        ];
        let lent = open(&requested(&resolve(&env).unwrap()).unwrap()).expect("the daemon lends");
        assert_eq!(lent.bytes(), 6 << 20);
    }
}
