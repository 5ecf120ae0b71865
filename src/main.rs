//! The `tensorfold` binary.

fn main() {
    std::process::exit(tensorfold::cli::main());
}
