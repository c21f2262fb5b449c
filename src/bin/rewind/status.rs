//! `rewind status`: a kubectl-style table of retry requests on workflows.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;

use rewind::follow::{self, Observed};
use rewind::workflow::Workflow;

use crate::connect::KubeArgs;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Only this workflow.
    #[arg(value_name = "WORKFLOW")]
    name: Option<String>,
    #[command(flatten)]
    kube: KubeArgs,
    /// Requests in every namespace.
    #[arg(short = 'A', long, conflicts_with = "name")]
    all_namespaces: bool,
    /// After the table, print a row each time a request changes, until Ctrl-C.
    #[arg(short = 'w', long)]
    watch: bool,
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    namespace: String,
    workflow: String,
    request: String,
    phase: String,
    pods: String,
    age: String,
    message: String,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let (client, namespace) = args.kube.connect().await?;
    let workflows: Api<Workflow> = if args.all_namespaces {
        Api::all(client)
    } else {
        Api::namespaced(client, &namespace)
    };
    let mut shown: BTreeMap<(String, String), Row> = BTreeMap::new();
    let rows = rows(&workflows, args.name.as_deref()).await?;
    if rows.is_empty() && !args.watch {
        let scope = if args.all_namespaces {
            "any namespace".to_owned()
        } else {
            format!("namespace {namespace}")
        };
        println!("No retry requests found in {scope}.");
        return Ok(());
    }
    print_header(args.all_namespaces);
    for row in rows {
        print_row(&row, args.all_namespaces);
        shown.insert((row.namespace.clone(), row.workflow.clone()), row);
    }
    if !args.watch {
        return Ok(());
    }
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for row in self::rows(&workflows, args.name.as_deref()).await? {
            let key = (row.namespace.clone(), row.workflow.clone());
            if shown.get(&key) != Some(&row) {
                print_row(&row, args.all_namespaces);
                shown.insert(key, row);
            }
        }
    }
}

async fn rows(workflows: &Api<Workflow>, name: Option<&str>) -> anyhow::Result<Vec<Row>> {
    let metas: Vec<PartialObjectMeta<Workflow>> = match name {
        Some(name) => workflows
            .get_metadata_opt(name)
            .await
            .with_context(|| format!("reading workflow {name}"))?
            .into_iter()
            .collect(),
        None => {
            workflows
                .list_metadata(&ListParams::default())
                .await
                .context("listing workflows")?
                .items
        }
    };
    let now = Timestamp::now();
    Ok(metas.iter().filter_map(|m| row(m, now)).collect())
}

fn row(meta: &PartialObjectMeta<Workflow>, now: Timestamp) -> Option<Row> {
    let annotations = meta.metadata.annotations.as_ref()?;
    let (request, observed) = follow::latest(annotations)?;
    let mut row = Row {
        namespace: meta.metadata.namespace.clone().unwrap_or_default(),
        workflow: meta.metadata.name.clone().unwrap_or_default(),
        request,
        phase: "Waiting".into(),
        pods: "-".into(),
        age: "-".into(),
        message: String::new(),
    };
    match observed {
        Ok(Observed::Status(s)) => {
            row.phase = format!("{:?}", s.phase);
            row.pods = format!("{}/{}", s.pods_deleted, s.pods_total);
            row.age = s
                .started_at
                .and_then(|t| t.parse::<Timestamp>().ok())
                .map_or_else(|| "-".into(), |t| age(now.duration_since(t)));
            row.message = s.message;
        }
        Ok(Observed::NotYet | Observed::Replaced { .. }) => {
            row.message = "not picked up by a controller yet".into();
        }
        Err(e) => row.message = format!("unreadable status: {e}"),
    }
    Some(row)
}

/// kubectl's short ages: 42s, 5m, 3h, 2d.
fn age(d: k8s_openapi::jiff::SignedDuration) -> String {
    let s = d.as_secs().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

const WIDTHS: [usize; 6] = [16, 32, 16, 14, 13, 5];

fn print_header(all: bool) {
    print_cells(
        all,
        [
            "NAMESPACE",
            "WORKFLOW",
            "REQUEST",
            "PHASE",
            "PODS",
            "AGE",
            "MESSAGE",
        ],
    );
}

fn print_row(r: &Row, all: bool) {
    print_cells(
        all,
        [
            &r.namespace,
            &r.workflow,
            &r.request,
            &r.phase,
            &r.pods,
            &r.age,
            &r.message,
        ],
    );
}

fn print_cells(all: bool, cells: [&str; 7]) {
    let mut line = String::new();
    for (i, cell) in cells.iter().enumerate() {
        if i == 0 && !all {
            continue;
        }
        match WIDTHS.get(i) {
            Some(w) => line.push_str(&format!("{cell:<w$} ", w = (*w).max(cell.len()))),
            None => line.push_str(cell),
        }
    }
    println!("{}", line.trim_end());
}
