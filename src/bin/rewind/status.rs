//! `rewind status`: a kubectl-style table of retry requests: annotations on
//! live workflows and WorkflowRetry objects.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;

use rewind::argo::workflow::Workflow;
use rewind::client::rows::{self, Row};
use rewind::protocol::crd::WorkflowRetry;

use crate::connect::KubeArgs;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Only this workflow, or this WorkflowRetry.
    #[arg(value_name = "NAME")]
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

/// Where the requests are read from.
struct Sources {
    workflows: Api<Workflow>,
    /// `None` once listing them was forbidden: the table shows the
    /// annotation requests alone rather than nothing.
    retries: Option<Api<WorkflowRetry>>,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let (client, namespace) = args.kube.connect().await?;
    let mut sources = if args.all_namespaces {
        Sources {
            workflows: Api::all(client.clone()),
            retries: Some(Api::all(client)),
        }
    } else {
        Sources {
            workflows: Api::namespaced(client.clone(), &namespace),
            retries: Some(Api::namespaced(client, &namespace)),
        }
    };
    let mut shown: BTreeMap<(String, String), Row> = BTreeMap::new();
    let rows = rows(&mut sources, args.name.as_deref()).await?;
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
        shown.insert((row.namespace.clone(), row.request.clone()), row);
    }
    if !args.watch {
        return Ok(());
    }
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for row in self::rows(&mut sources, args.name.as_deref()).await? {
            let key = (row.namespace.clone(), row.request.clone());
            if shown.get(&key) != Some(&row) {
                print_row(&row, args.all_namespaces);
                shown.insert(key, row);
            }
        }
    }
}

async fn rows(sources: &mut Sources, name: Option<&str>) -> anyhow::Result<Vec<Row>> {
    let workflows: Vec<PartialObjectMeta<Workflow>> = match name {
        Some(name) => sources
            .workflows
            .get_metadata_opt(name)
            .await
            .with_context(|| format!("reading workflow {name}"))?
            .into_iter()
            .collect(),
        None => {
            sources
                .workflows
                .list_metadata(&ListParams::default())
                .await
                .context("listing workflows")?
                .items
        }
    };
    let listed = match &sources.retries {
        Some(api) => api.list(&ListParams::default()).await.map(|l| l.items),
        None => Ok(Vec::new()),
    };
    let retries = match listed {
        Ok(items) => items,
        // Without the CRD there are no WorkflowRetry objects to show.
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            eprintln!(
                "You may not list WorkflowRetry objects here: showing annotation requests only."
            );
            sources.retries = None;
            Vec::new()
        }
        Err(e) => return Err(e).context("listing WorkflowRetry objects"),
    };
    Ok(rows::rows(&workflows, &retries, name, Timestamp::now()))
}

// WORKFLOW fits an archived UID (36 characters) while the controller has not named the workflow yet.
const WIDTHS: [usize; 6] = [16, 36, 26, 14, 13, 5];

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
