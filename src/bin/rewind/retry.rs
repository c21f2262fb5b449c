//! `rewind retry`: asks for retries as `argo retry` takes them (and, with
//! `--archived UID`, as `argo archive retry` does) and follows them to the
//! end, with a progress bar per workflow on a terminal and plain timestamped
//! lines otherwise.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use kube::api::{Api, ListParams};

use rewind::argo::plan::selector::Selector;
use rewind::argo::plan::{ArgoVersion, RetryOptions, compress::DEFAULT_MAX_WORKFLOW_SIZE};
use rewind::argo::workflow::Workflow;
use rewind::client::follow::{self, Follower, Observed};
use rewind::client::preview::{self, Preview};
use rewind::client::{Asked, FollowError, Source, ask};
use rewind::protocol::crd::WorkflowRetry;
use rewind::protocol::hint::{self, Refusal};
use rewind::protocol::request::{RequestOptions, RetryPhase, RetryStatus};

use crate::connect::KubeArgs;
use crate::parse_duration;

#[derive(clap::Args)]
pub struct RetryArgs {
    /// Workflows to retry (and/or choose them with -l / --field-selector).
    #[arg(value_name = "WORKFLOW")]
    names: Vec<String>,
    #[command(flatten)]
    kube: KubeArgs,
    /// Indicates to restart successful nodes matching the --node-field-selector.
    #[arg(long)]
    restart_successful: bool,
    /// Selector of nodes to reset, e.g. --node-field-selector inputs.parameters.myparam.value=abc.
    #[arg(long, default_value = "")]
    node_field_selector: String,
    /// Input parameter to override on the original workflow spec (repeatable).
    #[arg(short = 'p', long = "parameter", value_name = "NAME=VALUE")]
    parameters: Vec<String>,
    /// Selector (label query) to filter on, supports '=', '==', and '!=' (e.g. -l key1=value1,key2=value2).
    #[arg(short = 'l', long)]
    selector: Option<String>,
    /// Selector (field query) to filter on, supports '=', '==', and '!=' (e.g. --field-selector metadata.name=wf).
    #[arg(long)]
    field_selector: Option<String>,
    /// Retry the archived workflow with this UID (as `argo archive retry UID`): creates a
    /// WorkflowRetry the controller serves from Argo's archive. Takes no WORKFLOW, -l or
    /// --field-selector.
    #[arg(long, value_name = "UID", conflicts_with_all = ["names", "selector", "field_selector"])]
    archived: Option<String>,
    /// Delete the WorkflowRetry asked for one workflow or --archived this long after it
    /// finished (e.g. 1h; at most a year).
    #[arg(long, default_value = "24h", value_parser = parse_ttl)]
    ttl: Duration,
    /// Return once the request is asked, without following it.
    #[arg(long)]
    no_wait: bool,
    /// Print what the retry would do (nodes, pods, bulk delete, time) and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the final status (or, with --dry-run, the plan) for scripts.
    #[arg(short = 'o', long, value_enum)]
    output: Option<Output>,
    /// Give up following when no controller has answered within this time (once it answered
    /// one request of a batch, the others are followed while they wait in its queue).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    controller_timeout: Duration,
    /// --dry-run: the controller's budget of mutating requests per second.
    #[arg(long, default_value = "20")]
    qps: u32,
    /// --dry-run: the controller's burst of mutating requests.
    #[arg(long, default_value = "30")]
    burst: u32,
    /// --dry-run: the controller runs with --no-bulk.
    #[arg(long)]
    no_bulk: bool,
    /// --dry-run: the Argo line whose retry rules apply ("v4" or "v3.7").
    #[arg(long, default_value = "v4")]
    argo_version: ArgoVersion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Json,
    Yaml,
    Name,
}

/// How one followed request ended, as `-o json|yaml` prints it.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    namespace: String,
    workflow: String,
    request: String,
    /// The WorkflowRetry that asked, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    workflow_retry: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<RetryStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// From asking to the end, as the user waited.
    #[serde(skip)]
    pub elapsed: Duration,
}

impl Outcome {
    fn succeeded(&self) -> bool {
        self.error.is_none() && self.status.as_ref().map(|s| s.phase) == Some(RetryPhase::Succeeded)
    }
}

pub async fn run(args: RetryArgs) -> anyhow::Result<()> {
    // As `argo retry`, refuse a selector that does not parse before asking anything.
    if let Err(e) = Selector::parse(&args.node_field_selector) {
        let error = e.clone().into();
        let hint = hint::explain(Refusal::Plan(&error), "WORKFLOW", &Default::default())
            .unwrap_or_default();
        bail!(
            "unable to parse node field selector '{}': {e} — {hint}",
            args.node_field_selector
        );
    }
    let (client, namespace) = args.kube.connect().await?;
    let workflows: Api<Workflow> = Api::namespaced(client.clone(), &namespace);
    let options = RequestOptions {
        restart_successful: args.restart_successful,
        node_field_selector: args.node_field_selector.clone(),
        parameters: (!args.parameters.is_empty()).then(|| args.parameters.clone()),
    };
    if let Some(uid) = &args.archived {
        return archived(&workflows, &namespace, uid, &options, &args).await;
    }
    let names = resolve(&workflows, &args).await?;
    if args.dry_run {
        return dry_run(&client, &namespace, &names, &args).await;
    }
    let selected = args.selector.is_some() || args.field_selector.is_some();
    let asked = match names.as_slice() {
        // One workflow: a WorkflowRetry, whose status the controller updates
        // each second of the deletions (the workflow's own report is written
        // rarely, as each write rewrites the whole workflow).
        [name] if !selected => {
            vec![ask_one(&workflows, &namespace, name, &options, args.ttl).await?]
        }
        // A batch: the annotations, with one token for all: to the
        // controller, one asker, however many workflows.
        names => {
            let token = ask::new_token();
            let mut asked = Vec::new();
            for name in names {
                asked.push(ask::ask(&workflows, &namespace, name, &options, &token).await?);
            }
            asked
        }
    };
    if args.no_wait {
        for a in &asked {
            match (&a.source, args.output) {
                (Source::Annotation, Some(Output::Name)) => {
                    println!("workflow.argoproj.io/{}", a.workflow)
                }
                (Source::Annotation, _) => println!(
                    "workflow.argoproj.io/{} retry requested (request {}); follow it with `rewind status {} -n {} -w`",
                    a.workflow, a.token, a.workflow, a.namespace
                ),
                (Source::WorkflowRetry { .. }, Some(Output::Name)) => {
                    println!("workflowretry.rewind.dev/{}", a.token)
                }
                (Source::WorkflowRetry { .. }, _) => println!(
                    "workflowretry.rewind.dev/{} created for workflow {}; follow it with `rewind status {} -n {} -w`",
                    a.token, a.workflow, a.token, a.namespace
                ),
            }
        }
        return Ok(());
    }
    follow_to_the_end(&workflows, &namespace, asked, &args).await
}

/// Asks for the retry of live workflow `name` with a WorkflowRetry, once it
/// is known to exist (a missing one is refused at once, as with a batch).
pub async fn ask_one(
    workflows: &Api<Workflow>,
    namespace: &str,
    name: &str,
    options: &RequestOptions,
    ttl: Duration,
) -> anyhow::Result<Asked> {
    let found = workflows
        .get_metadata_opt(name)
        .await
        .with_context(|| format!("reading workflow {namespace}/{name}"))?;
    if found.is_none() {
        return Err(FollowError::NotFound {
            namespace: namespace.to_owned(),
            workflow: name.to_owned(),
        }
        .into());
    }
    let retries: Api<WorkflowRetry> = Api::namespaced(workflows.clone().into_client(), namespace);
    let target = ask::Target::Live(name);
    let (asked, _) =
        ask::ask_object(&retries, namespace, target, options, ttl, None, false).await?;
    Ok(asked)
}

/// Follows `asked` and finishes as [`finish`] does; on Ctrl-C, says the
/// requests keep running and exits 130.
async fn follow_to_the_end(
    workflows: &Api<Workflow>,
    namespace: &str,
    asked: Vec<Asked>,
    args: &RetryArgs,
) -> anyhow::Result<()> {
    let Some(outcomes) = follow_asked(workflows, asked, args.controller_timeout).await? else {
        eprintln!(
            "\nStopped following. The retry requests keep running on the controller; see them with `rewind status -n {namespace}`."
        );
        std::process::exit(130);
    };
    finish(&outcomes, args.output)
}

/// `--archived UID`: creates a WorkflowRetry for the archived workflow and
/// follows it as a live request.
async fn archived(
    workflows: &Api<Workflow>,
    namespace: &str,
    uid: &str,
    options: &RequestOptions,
    args: &RetryArgs,
) -> anyhow::Result<()> {
    let retries: Api<WorkflowRetry> = Api::namespaced(workflows.clone().into_client(), namespace);
    let (asked, created) = ask::ask_object(
        &retries,
        namespace,
        ask::Target::Archived(uid),
        options,
        args.ttl,
        None,
        args.dry_run,
    )
    .await?;
    let name = &asked.token;
    if args.dry_run {
        match args.output {
            Some(Output::Json) => println!("{}", serde_json::to_string_pretty(&created)?),
            Some(Output::Yaml) => print!("{}", serde_yaml_ng::to_string(&created)?),
            Some(Output::Name) => println!("workflowretry.rewind.dev/{name}"),
            None => {
                println!(
                    "WorkflowRetry {namespace}/{name} for archived workflow {uid} (dry run: the API server accepted it; nothing was created)"
                );
                println!(
                    "  the plan (nodes to reset, pods to delete) needs the archived workflow, which only the controller reads from Argo's archive: run without --dry-run to retry it"
                );
            }
        }
        return Ok(());
    }
    if args.no_wait {
        match args.output {
            Some(Output::Name) => println!("workflowretry.rewind.dev/{name}"),
            _ => println!(
                "workflowretry.rewind.dev/{name} created to retry archived workflow {uid}; follow it with `rewind status {name} -n {namespace} -w`"
            ),
        }
        return Ok(());
    }
    follow_to_the_end(workflows, namespace, vec![asked], args).await
}

/// Follows asked requests to their end with progress on stderr; `None`
/// when Ctrl-C stopped following (the requests keep running).
pub async fn follow_asked(
    workflows: &Api<Workflow>,
    asked: Vec<Asked>,
    controller_timeout: Duration,
) -> anyhow::Result<Option<Vec<Outcome>>> {
    let client = workflows.clone().into_client();
    let followers = asked
        .into_iter()
        .map(|a| Follower::new(client.clone(), a))
        .collect();
    tokio::select! {
        outcomes = follow_all(followers, controller_timeout) => outcomes.map(Some),
        _ = tokio::signal::ctrl_c() => Ok(None),
    }
}

/// Prints the outcomes (a summary, or `output` for scripts) and fails with
/// the controller's message unless every retry succeeded.
pub fn finish(outcomes: &[Outcome], output: Option<Output>) -> anyhow::Result<()> {
    report(outcomes, output)?;
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.succeeded()).collect();
    match failed.as_slice() {
        [] => Ok(()),
        [one] => bail!(
            "retry of {}/{} failed: {}",
            one.namespace,
            one.workflow,
            failure(one)
        ),
        many => bail!("{} of {} retries failed", many.len(), outcomes.len()),
    }
}

/// The workflows named and those the selectors match, each once, in order.
async fn resolve(workflows: &Api<Workflow>, args: &RetryArgs) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    if args.selector.is_some() || args.field_selector.is_some() {
        let mut lp = ListParams::default();
        if let Some(l) = &args.selector {
            lp = lp.labels(l);
        }
        if let Some(f) = &args.field_selector {
            lp = lp.fields(f);
        }
        let listed = workflows
            .list_metadata(&lp)
            .await
            .context("listing the workflows the selectors match")?;
        names.extend(listed.items.into_iter().filter_map(|m| m.metadata.name));
    }
    names.extend(args.names.iter().cloned());
    let mut seen = BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    if names.is_empty() {
        bail!(
            "no workflow to retry: name one, or choose them with -l / --field-selector (none matched)"
        );
    }
    Ok(names)
}

async fn dry_run(
    client: &kube::Client,
    namespace: &str,
    names: &[String],
    args: &RetryArgs,
) -> anyhow::Result<()> {
    let workflows: Api<Workflow> = Api::namespaced(client.clone(), namespace);
    let options = RetryOptions {
        restart_successful: args.restart_successful,
        node_field_selector: args.node_field_selector.clone(),
        parameters: (!args.parameters.is_empty()).then(|| args.parameters.clone()),
        argo_version: args.argo_version,
        max_workflow_size: DEFAULT_MAX_WORKFLOW_SIZE,
        ..Default::default()
    };
    let mut previews = Vec::new();
    let mut refused = 0;
    for name in names {
        let wf = workflows
            .get(name)
            .await
            .with_context(|| format!("reading workflow {namespace}/{name}"))?;
        let plan = match rewind::argo::plan::plan_retry(&wf, &options) {
            Ok(plan) => plan,
            Err(e) => {
                let empty = Default::default();
                let annotations = wf.metadata.annotations.as_ref().unwrap_or(&empty);
                eprintln!(
                    "{namespace}/{name}: cannot retry: {}",
                    hint::message(Refusal::Plan(&e), name, annotations)
                );
                refused += 1;
                continue;
            }
        };
        let planned = plan.pods_to_delete.iter().cloned().collect();
        let listed =
            match rewind::engine::pods::list_workflow_pods(client, namespace, name, &planned, None)
                .await
            {
                Ok(listed) => Some(listed.pods),
                // Users may ask for retries without the right to list pods.
                Err(kube::Error::Api(s)) if s.code == 403 => None,
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("listing the pods of workflow {namespace}/{name}")
                    });
                }
            };
        previews.push(preview::preview(
            name,
            &plan,
            listed.as_deref(),
            !args.no_bulk,
            args.qps,
            args.burst,
        ));
    }
    match args.output {
        Some(Output::Json) => println!("{}", serde_json::to_string_pretty(&previews)?),
        Some(Output::Yaml) => print!("{}", serde_yaml_ng::to_string(&previews)?),
        Some(Output::Name) => previews
            .iter()
            .for_each(|p| println!("workflow.argoproj.io/{}", p.workflow)),
        None => previews
            .iter()
            .for_each(|p| print_preview(namespace, p, args)),
    }
    if refused > 0 {
        bail!(
            "{refused} of {} workflows cannot be retried (see above); nothing was changed",
            names.len()
        );
    }
    Ok(())
}

fn print_preview(namespace: &str, p: &Preview, args: &RetryArgs) {
    println!(
        "Workflow {namespace}/{} (dry run: nothing is changed)",
        p.workflow
    );
    println!(
        "  nodes to reset:   {} {}",
        p.nodes_reset.len(),
        list(&p.nodes_reset)
    );
    println!(
        "  nodes to delete:  {} {}",
        p.nodes_deleted.len(),
        list(&p.nodes_deleted)
    );
    println!(
        "  pods to delete:   {} {}",
        p.pods_to_delete.len(),
        list(&p.pods_to_delete)
    );
    let bulk = if !p.pods_listed {
        "unknown: you may not list pods (figures assume one request per pod)".to_owned()
    } else if p.bulk_pods > 0 {
        format!("yes: one DeleteCollection for {} pods", p.bulk_pods)
    } else if args.no_bulk {
        "no (--no-bulk)".to_owned()
    } else {
        "no: a pod outside the plan would match it".to_owned()
    };
    println!("  bulk delete:      {bulk}");
    println!("  single requests:  {}", p.single_requests);
    println!(
        "  estimated time:   {:.1}s for {} mutating requests at {} qps / burst {} (plus the API server's time for a bulk delete)",
        p.estimated_seconds, p.mutating_requests, args.qps, args.burst
    );
}

/// A short list for a human: the first few, then how many more.
fn list(items: &[String]) -> String {
    const SHOWN: usize = 5;
    if items.is_empty() {
        return String::new();
    }
    let head = items[..items.len().min(SHOWN)].join(", ");
    if items.len() > SHOWN {
        format!("({head}, ... {} more)", items.len() - SHOWN)
    } else {
        format!("({head})")
    }
}

/// Where the progress of the followed requests goes.
enum Display {
    Bars(Vec<ProgressBar>),
    Lines(Vec<Option<(RetryPhase, u64)>>),
}

/// Follows every request to its end (or until no controller answers).
async fn follow_all(
    mut followers: Vec<Follower>,
    timeout: Duration,
) -> anyhow::Result<Vec<Outcome>> {
    let started = Instant::now();
    let mut display = if std::io::stderr().is_terminal() {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let waiting =
            ProgressStyle::with_template("{prefix:24!} {spinner} {msg}").expect("a valid template");
        Display::Bars(
            followers
                .iter()
                .map(|f| {
                    let bar = multi.add(ProgressBar::new(0));
                    bar.set_style(waiting.clone());
                    bar.set_prefix(f.asked().workflow.clone());
                    bar.set_message("waiting for the controller");
                    bar.enable_steady_tick(Duration::from_millis(200));
                    bar
                })
                .collect(),
        )
    } else {
        Display::Lines(vec![None; followers.len()])
    };
    let mut outcomes: Vec<Option<Outcome>> = followers.iter().map(|_| None).collect();
    // One read per workflow a round: at most 20 reads a second, however many.
    let interval = follow::POLL_INTERVAL.max(Duration::from_millis(50) * followers.len() as u32);
    while outcomes.iter().any(Option::is_none) {
        // A controller that answered one request of the batch is there: the
        // others wait their turn in its queue, however long that takes.
        let served = followers.iter().any(Follower::answered);
        for (i, follower) in followers.iter_mut().enumerate() {
            if outcomes[i].is_some() {
                continue;
            }
            let observed = follower.poll().await?;
            show(
                &mut display,
                i,
                follower.asked(),
                &observed,
                started.elapsed(),
            );
            let asked = follower.asked().clone();
            let outcome = |status, error| Outcome {
                namespace: asked.namespace.clone(),
                workflow: asked.workflow.clone(),
                request: asked.token.clone(),
                workflow_retry: match asked.source {
                    Source::Annotation => None,
                    Source::WorkflowRetry { .. } => Some(asked.token.clone()),
                },
                status,
                error,
                elapsed: started.elapsed(),
            };
            outcomes[i] = match observed {
                Observed::Status(s) if s.phase.is_finished() => Some(outcome(Some(s), None)),
                Observed::Replaced { by } => Some(outcome(
                    None,
                    Some(format!(
                        "a newer request ({by}) replaced request {} before it ran",
                        asked.token
                    )),
                )),
                _ if !served && follower.unanswered_for(timeout) => Some(outcome(
                    None,
                    Some(follow::no_controller_message(&asked, timeout)),
                )),
                _ => None,
            };
            if let (Display::Bars(bars), Some(o)) = (&display, &outcomes[i]) {
                bars[i].disable_steady_tick();
                if o.succeeded() {
                    bars[i].finish_with_message("Succeeded");
                } else {
                    // Keeps the bar where it stopped.
                    bars[i].abandon_with_message("Failed");
                }
            }
        }
        if outcomes.iter().any(Option::is_none) {
            tokio::time::sleep(interval).await;
        }
    }
    Ok(outcomes.into_iter().flatten().collect())
}

fn show(display: &mut Display, i: usize, asked: &Asked, observed: &Observed, elapsed: Duration) {
    let Observed::Status(status) = observed else {
        return;
    };
    match display {
        Display::Bars(bars) => {
            let bar = &bars[i];
            // An archived retry's workflow is named once the controller read the archive.
            bar.set_prefix(asked.workflow.clone());
            if bar.length() == Some(0) && bar.position() == 0 && status.pods_total > 0 {
                bar.disable_steady_tick();
                bar.set_style(
                    ProgressStyle::with_template("{prefix:24!} [{bar:30}] {pos}/{len} pods  {msg}")
                        .expect("a valid template")
                        .progress_chars("=> "),
                );
            }
            bar.set_length(status.pods_total);
            bar.set_position(status.pods_deleted);
            let (rate, left) = follow::pace(status, elapsed);
            let eta = left.map_or_else(|| "-".to_owned(), |d| format!("{}s", d.as_secs()));
            bar.set_message(format!("{rate:.0} pods/s  ETA {eta}  {:?}", status.phase));
        }
        Display::Lines(last) => {
            let now = (status.phase, status.pods_deleted);
            if last[i] == Some(now) {
                return;
            }
            last[i] = Some(now);
            let (rate, left) = follow::pace(status, elapsed);
            let eta = left.map_or_else(|| "-".to_owned(), |d| format!("{}s", d.as_secs()));
            eprintln!(
                "{} {}/{} {:?} {}/{} pods deleted, {rate:.1}/s, ETA {eta}",
                rewind::protocol::request::now(),
                asked.namespace,
                asked.workflow,
                status.phase,
                status.pods_deleted,
                status.pods_total,
            );
        }
    }
}

fn failure(o: &Outcome) -> String {
    o.error.clone().unwrap_or_else(|| {
        o.status
            .as_ref()
            .map(|s| s.message.clone())
            .unwrap_or_default()
    })
}

fn report(outcomes: &[Outcome], output: Option<Output>) -> anyhow::Result<()> {
    match output {
        Some(Output::Json) => println!("{}", serde_json::to_string_pretty(outcomes)?),
        Some(Output::Yaml) => print!("{}", serde_yaml_ng::to_string(outcomes)?),
        Some(Output::Name) => outcomes
            .iter()
            .for_each(|o| println!("workflow.argoproj.io/{}", o.workflow)),
        None => {
            for o in outcomes {
                if o.succeeded() {
                    let pods = o.status.as_ref().map_or(0, |s| s.pods_deleted);
                    let request = match &o.workflow_retry {
                        Some(name) => format!("workflowretry/{name}"),
                        None => format!("request {}", o.request),
                    };
                    println!(
                        "{}/{}: retried; {pods} pods deleted in {:.1}s ({request})",
                        o.namespace,
                        o.workflow,
                        o.elapsed.as_secs_f64(),
                    );
                } else {
                    println!("{}/{}: failed: {}", o.namespace, o.workflow, failure(o));
                }
            }
            if outcomes.len() > 1 {
                let ok = outcomes.iter().filter(|o| o.succeeded()).count();
                let pods: u64 = outcomes
                    .iter()
                    .filter_map(|o| o.status.as_ref().map(|s| s.pods_deleted))
                    .sum();
                let slowest = outcomes.iter().map(|o| o.elapsed).max().unwrap_or_default();
                println!(
                    "{ok} of {} retries succeeded; {pods} pods deleted in {:.1}s",
                    outcomes.len(),
                    slowest.as_secs_f64()
                );
            }
        }
    }
    Ok(())
}

/// A `--ttl`: a duration the WorkflowRetry's `ttlSecondsAfterFinished` can hold.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    let max = rewind::protocol::crd::MAX_TTL_SECONDS;
    if ttl.as_secs() > max as u64 {
        return Err(format!(
            "{text} is longer than a year ({max}s), the longest TTL a WorkflowRetry takes"
        ));
    }
    Ok(ttl)
}
