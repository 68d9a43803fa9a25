//! Test helper: the child entry of heavy jobs (`kiln-job-child __job <id>`),
//! the same code `kiln __job <id>` runs, with the built-in kinds.

fn main() {
    let registry = kiln_jobs::Registry::with_builtins();
    std::process::exit(kiln_jobs::child_main(std::env::args().skip(1), &registry));
}
