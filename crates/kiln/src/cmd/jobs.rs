//! `kiln jobs …` (a client of a running server) and the hidden `kiln __job <id>`.

use std::io::{BufRead, BufReader};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

/// The job kinds this binary runs; the server's job host must use the same registry.
/// `loopback` is where the `dataset` kind's LLM templates reach the served model (set by
/// `kiln serve` once bound; a child never runs in-process kinds).
pub fn registry(loopback: kiln_lab::dataset::job::LoopbackCell) -> kiln_jobs::Registry {
    let mut registry = kiln_jobs::Registry::with_builtins();
    let models = kiln_hub::models_dir();
    let resolve =
        std::sync::Arc::new(|spec: &str| kiln_hub::resolve_model(spec, false).ok().map(|m| m.path));
    registry.register(
        "quantize",
        kiln_lab::quantize::job::QuantizeRunner::new(models, resolve.clone()),
    );
    let adapters = kiln_hub::cache_dir().join("adapters");
    registry.register(
        "finetune",
        kiln_lab::finetune::job::FinetuneRunner::new(adapters, resolve),
    );
    let datasets = kiln_hub::cache_dir().join("datasets");
    registry.register(
        "dataset",
        kiln_lab::dataset::job::DatasetRunner::new(datasets, loopback),
    );
    registry
}

/// `kiln __job <id>`: run one heavy job in this process (started by the server).
#[derive(Debug, Args)]
pub struct ChildArgs {
    /// The job id.
    pub id: String,
}

/// Runs the job; exits 0 (done), 1 (failed) or 2 (unknown job).
pub fn child(args: ChildArgs) -> ExitCode {
    let code = kiln_jobs::run_child(&args.id, &registry(Default::default()));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// `kiln jobs`.
#[derive(Debug, Args)]
pub struct JobsArgs {
    /// The server's base URL.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The server's API key (default: `KILN_API_KEY`), for a server started with `--api-key`.
    #[arg(long, global = true, env = "KILN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    #[command(subcommand)]
    pub command: JobsCommand,
}

/// What to do with jobs.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// The newest jobs.
    List {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Only this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One job's row (JSON).
    Show {
        /// The job id.
        id: String,
    },
    /// Follow a job's events until it ends; exits non-zero unless it is done.
    Tail {
        /// The job id.
        id: String,
    },
    /// Cancel a queued or running job.
    Cancel {
        /// The job id.
        id: String,
    },
    /// Submit a job; prints its id.
    Submit {
        /// The kind (e.g. `noop`).
        kind: String,
        /// The config, a JSON object.
        #[arg(long, default_value = "{}")]
        config: String,
        /// Then follow it as `tail` does.
        #[arg(long)]
        follow: bool,
    },
}

/// Runs a `kiln jobs` subcommand.
pub fn run(args: JobsArgs) -> Result<()> {
    let base = args.url.trim_end_matches('/');
    let key = args.api_key.as_deref().filter(|k| !k.is_empty());
    let request = |url: &str, body: Option<Value>| request(url, body, key);
    let tail = |base: &str, id: &str| tail(base, id, key);
    match args.command {
        JobsCommand::List { limit, kind, json } => {
            let mut url = format!("{base}/api/jobs?limit={limit}");
            if let Some(k) = kind {
                url.push_str(&format!("&kind={}", encode(&k)));
            }
            let body = request(&url, None)?;
            let jobs = body["jobs"].as_array().cloned().unwrap_or_default();
            if json {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
                return Ok(());
            }
            println!(
                "{:<21} {:<10} {:<9} {:>5}  {:<19}  message",
                "id", "kind", "status", "prog", "started"
            );
            for j in jobs {
                let progress = j["progress"].as_f64().unwrap_or(0.0) * 100.0;
                let msg = j["error"].as_str().or(j["message"].as_str()).unwrap_or("");
                println!(
                    "{:<21} {:<10} {:<9} {:>4.0}%  {:<19}  {msg}",
                    s(&j["id"]),
                    s(&j["kind"]),
                    s(&j["status"]),
                    progress,
                    s(&j["started_at"])
                );
            }
            Ok(())
        }
        JobsCommand::Show { id } => {
            let body = request(&format!("{base}/api/jobs/{}", encode(&id)), None)?;
            println!("{}", serde_json::to_string_pretty(&body["job"])?);
            Ok(())
        }
        JobsCommand::Tail { id } => tail(base, &id),
        JobsCommand::Cancel { id } => {
            let url = format!("{base}/api/jobs/{}/cancel", encode(&id));
            let body = request(&url, Some(json!({})))?;
            println!("{} {}", id, s(&body["job"]["status"]));
            Ok(())
        }
        JobsCommand::Submit {
            kind,
            config,
            follow,
        } => {
            let config: Value =
                serde_json::from_str(&config).context("--config is not valid JSON")?;
            let body = request(
                &format!("{base}/api/jobs"),
                Some(json!({"kind": kind, "config": config})),
            )?;
            let id = s(&body["job_id"]).to_string();
            println!("{id}");
            if follow { tail(base, &id) } else { Ok(()) }
        }
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

use kiln_lab::percent_encode as encode;

fn agent(timeout: Option<Duration>) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(timeout)
        .build()
        .into()
}

/// A GET (no body) or a JSON POST, with the API key when given; a non-2xx answer becomes an
/// error with the server's message.
pub fn request(url: &str, body: Option<Value>, key: Option<&str>) -> Result<Value> {
    let agent = agent(Some(Duration::from_secs(30)));
    let bearer = key.map(|k| format!("Bearer {k}"));
    let resp = match body {
        None => {
            let mut r = agent.get(url);
            if let Some(b) = &bearer {
                r = r.header("authorization", b);
            }
            r.call()
        }
        Some(body) => {
            let mut r = agent.post(url).header("content-type", "application/json");
            if let Some(b) = &bearer {
                r = r.header("authorization", b);
            }
            r.send(body.to_string().as_bytes())
        }
    };
    let mut resp =
        resp.with_context(|| format!("cannot reach {url} (is `kiln serve` running?)"))?;
    let status = resp.status();
    let text = resp
        .body_mut()
        .read_to_string()
        .context("reading the response")?;
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if !status.is_success() {
        let msg = value["error"]
            .as_str()
            .or(value["error"]["message"].as_str())
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string());
        bail!("{status}: {msg}");
    }
    Ok(value)
}

/// Follows `/api/jobs/{id}/stream`, printing one line per event.
pub fn tail(base: &str, id: &str, key: Option<&str>) -> Result<()> {
    let url = format!("{base}/api/jobs/{}/stream", encode(id));
    let mut req = agent(None).get(&url);
    if let Some(k) = key {
        req = req.header("authorization", &format!("Bearer {k}"));
    }
    let mut resp = req.call().with_context(|| format!("cannot reach {url}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let msg = value["error"]["message"]
            .as_str()
            .or(value["error"].as_str())
            .unwrap_or("");
        bail!("{status}: cannot stream job {id}: {msg}");
    }
    let mut outcome = None;
    let mut end = false;
    for line in BufReader::new(resp.into_body().into_reader()).lines() {
        let line = line.context("reading the stream")?;
        if line == "event: end" {
            end = true;
            continue;
        }
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        if end {
            break;
        }
        let ev: Value = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
        match ev["type"].as_str() {
            Some("log") => println!("{}", s(&ev["line"])),
            Some("started") => println!("[started]"),
            Some("stage") => {
                let p = ev["progress"]
                    .as_f64()
                    .map(|p| format!(" {:.0}%", p * 100.0))
                    .unwrap_or_default();
                let m = ev["message"]
                    .as_str()
                    .map(|m| format!(" {m}"))
                    .unwrap_or_default();
                println!("[stage] {}{p}{m}", s(&ev["stage"]));
            }
            Some(t @ ("done" | "failed" | "cancelled")) => {
                println!(
                    "[{t}] {}",
                    ev["error"].as_str().or(ev["reason"].as_str()).unwrap_or("")
                );
                outcome = Some(t.to_string());
            }
            Some(t) => println!("[{t}] {}", data.trim()),
            None => {}
        }
    }
    match outcome.as_deref() {
        Some("done") => Ok(()),
        Some(other) => bail!("job {id} {other}"),
        None => bail!("job {id}: the stream ended without a result"),
    }
}
