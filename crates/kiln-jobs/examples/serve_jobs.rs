//! Serves only the jobs API, for trying `kiln jobs …` by hand:
//! `cargo run -p kiln-jobs --example serve_jobs -- <port> <child-program> [data-dir]`
//! (child program: `target/debug/kiln` or `target/debug/kiln-job-child`).

use kiln_jobs::{HostConfig, JobHost, JobPaths, Registry};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().as_deref().unwrap_or("8080").parse()?;
    let child = args
        .next()
        .ok_or("usage: serve_jobs <port> <child-program> [data-dir]")?;
    let paths = match args.next() {
        Some(dir) => JobPaths::new(dir),
        None => JobPaths::from_env()?,
    };
    let mut cfg = HostConfig::new(paths, Registry::with_builtins())?;
    cfg.child_program = child.into();
    let host = JobHost::open(cfg)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    eprintln!("jobs API on http://{}/api/jobs", listener.local_addr()?);
    let app = kiln_jobs::http::router(host.clone());
    // Close the jobs inside the shutdown future: open SSE tails end once their
    // jobs are terminal, so connection draining cannot wait on a running job.
    let closing = host.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            closing.close().await;
        })
        .await?;
    Ok(())
}
