//! What a fresh machine (the Rust toolchain, gcc, Python 3 with pip) needs to build and test: no CMake anywhere in
//! the dependency tree, and CI runs the README's own test command.

use std::path::Path;

fn repo_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The lock file's packages as (name, its dependencies' names).
fn locked_packages(lock: &str) -> Vec<(String, Vec<String>)> {
    let mut packages = Vec::new();
    for block in lock.split("[[package]]").skip(1) {
        let name = block.lines().find_map(|l| l.strip_prefix("name = ")).unwrap_or_default().trim_matches('"');
        let deps = block.split("dependencies = [").nth(1).and_then(|d| d.split(']').next()).unwrap_or_default();
        let deps = deps.lines().map(|l| l.trim().trim_end_matches(',').trim_matches('"')).filter(|l| !l.is_empty());
        let names = deps.map(|d| d.split(' ').next().unwrap_or(d).to_string()).collect();
        packages.push((name.to_string(), names));
    }
    packages
}

#[test]
fn test_no_dependency_builds_with_cmake() {
    let packages = locked_packages(&repo_file("Cargo.lock"));
    assert!(packages.len() > 100, "the lock file parsed to {} packages", packages.len());
    assert!(packages.iter().any(|(name, _)| name == "opus-rs"), "the Opus encoder is not locked");
    let users: Vec<&str> =
        packages.iter().filter(|(_, deps)| deps.iter().any(|d| d == "cmake")).map(|(n, _)| n.as_str()).collect();
    assert!(users.is_empty(), "these crates build C code with CMake, which a fresh machine lacks: {users:?}");
    assert!(!packages.iter().any(|(name, _)| name == "cmake"), "the cmake crate is in the dependency tree");
}

#[test]
fn test_ci_runs_the_readme_test_command() {
    let readme = repo_file("README.md");
    for command in ["cargo run --release -- serve", "cargo test --workspace"] {
        assert!(readme.contains(&format!("\n{command}\n")), "the README does not give `{command}` on a line");
    }
    let ci = repo_file(".ci/run");
    let commands: Vec<&str> = ci.lines().filter(|l| l.trim_start().starts_with("cargo ")).collect();
    assert_eq!(commands, ["cargo test --workspace"], "CI must run the README's test command and no other cargo");
    assert!(!ci.contains("cmake"), "CI installs CMake, which the README's machine lacks");
    assert!(!ci.contains("pip install"), "CI installs Python packages the test command should provision itself");
}
