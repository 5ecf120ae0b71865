//! The table's flags on the command line: each row of a command's scopes becomes a clap argument.

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

use super::{Key, Kind, Scope, Setting, SETTINGS};

/// Scopes as bits, for `TableArgs`.
pub const MODEL: u8 = 1;
pub const SERVE: u8 = 2;
pub const SPEECH: u8 = 4;
pub const LEND: u8 = 8;

/// The flags of every row whose scope is in `SCOPES`, as given on the command line (raw, checked by the table).
#[derive(Clone, Debug, Default)]
pub struct TableArgs<const SCOPES: u8> {
    pub given: Vec<(Key, String)>,
}

fn in_scope(s: &Setting, scopes: u8) -> bool {
    match s.scope {
        Scope::Model => scopes & MODEL != 0,
        Scope::Serve => scopes & SERVE != 0,
        Scope::Speech => scopes & SPEECH != 0,
        Scope::Lend => scopes & LEND != 0,
        Scope::ModelAndLend => scopes & (MODEL | LEND) != 0,
        Scope::Env => false,
    }
}

fn arg(s: &'static Setting, flag: &'static str) -> Arg {
    let mut help = s.help.to_string();
    if let Some(default) = s.default {
        help.push_str(&format!(" [default: {default}]"));
    }
    if let Some(env) = s.env {
        help.push_str(&format!(" [env: {env}]"));
    }
    let arg = Arg::new(flag).long(flag).help(help);
    match s.kind {
        Kind::Flag => arg.action(ArgAction::SetTrue),
        Kind::Count { .. } => arg.value_name("N"),
        Kind::Path => arg.value_name("PATH"),
        Kind::Choice(_) => arg.value_name("WORD"),
        _ => arg.value_name("VALUE"),
    }
}

impl<const SCOPES: u8> FromArgMatches for TableArgs<SCOPES> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Vec::new();
        for s in SETTINGS.iter().filter(|s| in_scope(s, SCOPES)) {
            let Some(flag) = s.flag else { continue };
            match s.kind {
                Kind::Flag if matches.get_flag(flag) => given.push((s.key, "1".to_string())),
                Kind::Flag => {}
                _ => given.extend(matches.get_one::<String>(flag).map(|v| (s.key, v.clone()))),
            }
        }
        Ok(TableArgs { given })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl<const SCOPES: u8> Args for TableArgs<SCOPES> {
    fn augment_args(cmd: Command) -> Command {
        let rows = SETTINGS.iter().filter(|s| in_scope(s, SCOPES));
        rows.fold(cmd, |cmd, s| match s.flag {
            Some(flag) => cmd.arg(arg(s, flag)),
            None => cmd,
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}
