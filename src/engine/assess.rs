//! Deciding how to delete a plan's pods exactly: one bulk DeleteCollection
//! where it provably selects nothing outside the plan, single deletes with a
//! UID precondition for the rest.
//!
//! Pure: it reads a fresh list of the workflow's pods and returns the work.
//! Rule 3 of the design lives here: no pod outside the plan is ever deleted.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::argo::workflow::labels;

/// A pod as the assessment sees it: the facts of its metadata it reads, and
/// the one fact of its status that matters here, whether it succeeded (the
/// bulk field selector's term). Small on purpose: a request holds one per pod
/// of its workflow (20,000 and more), so not the pod's metadata.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listed {
    pub name: String,
    pub uid: String,
    /// The value of Argo's workflow label.
    pub workflow: Option<String>,
    /// Labelled completed=true: Argo has finished with it.
    pub completed: bool,
    /// Labelled completed=false, as Argo creates its pods: in Argo's pod
    /// informer (which selects completed=false), so Argo will label it
    /// completed=true once it has finished with it (see [`Assessment::settle`]).
    pub unsettled: bool,
    /// Carries Argo's node annotations: Argo made it.
    pub argos: bool,
    /// Being deleted (a deletion timestamp): what keeps it, for a status
    /// that names it. Boxed: few pods are, and a request holds one `Listed`
    /// per pod of its workflow.
    pub terminating: Option<Box<Terminating>>,
    /// Where Argo's status finalizer is among the pod's finalizers.
    pub status_finalizer: Option<usize>,
    /// The UIDs of the pod's owners.
    pub owners: Vec<String>,
    pub succeeded: bool,
}

impl Listed {
    /// Keeps of `meta` what the assessment reads; `None` for a pod without a
    /// name, which no list returns.
    pub fn new(meta: ObjectMeta, succeeded: bool) -> Option<Listed> {
        let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key));
        Some(Listed {
            workflow: label(labels::WORKFLOW).cloned(),
            completed: label(labels::COMPLETED).is_some_and(|v| v == "true"),
            unsettled: label(labels::COMPLETED).is_some_and(|v| v == "false"),
            argos: [labels::NODE_ID, labels::NODE_NAME].iter().any(|key| {
                meta.annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(*key))
            }),
            terminating: meta.deletion_timestamp.map(|at| {
                Box::new(Terminating {
                    since: at.0.to_string(),
                    finalizers: meta.finalizers.clone().unwrap_or_default(),
                })
            }),
            status_finalizer: meta
                .finalizers
                .as_ref()
                .and_then(|f| f.iter().position(|f| f == labels::POD_STATUS_FINALIZER)),
            owners: meta
                .owner_references
                .into_iter()
                .flatten()
                .map(|r| r.uid)
                .collect(),
            uid: meta.uid.unwrap_or_default(),
            name: meta.name?,
            succeeded,
        })
    }
}

/// A pod being deleted, as its metadata says: when the deletion was asked
/// and the finalizers that keep it until whoever set them removes them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Terminating {
    /// The deletion timestamp, as the API server gives it (RFC 3339).
    pub since: String,
    pub finalizers: Vec<String>,
}

/// The pod phase the bulk field selector excludes.
pub const SUCCEEDED: &str = "Succeeded";

/// One unit of deletion work, each one API request.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeleteWork {
    /// DeleteCollection of the pods these selectors pick (see [`bulk_selectors`]).
    Bulk {
        workflow: String,
        label_selector: String,
        field_selector: String,
        pods: Vec<String>,
        /// The UIDs of the plan pods the list that proved the request exact
        /// showed: right before it is sent, the selectors may pick no other
        /// (see `engine::workers`, "re-proved").
        uids: BTreeSet<String>,
    },
    /// Delete one pod, only if it still has this UID.
    Pod { name: String, uid: String },
    /// Remove Argo's `workflows.argoproj.io/status` finalizer (at `index` in
    /// the pod's finalizers) from a pod that is already being deleted, only if
    /// the pod still has this UID and the finalizer is still at that index.
    Finalizer {
        name: String,
        uid: String,
        index: usize,
    },
}

impl DeleteWork {
    /// The pod names this work deletes or releases.
    pub fn pods(&self) -> Vec<&str> {
        match self {
            DeleteWork::Bulk { pods, .. } => pods.iter().map(String::as_str).collect(),
            DeleteWork::Pod { name, .. } | DeleteWork::Finalizer { name, .. } => {
                vec![name.as_str()]
            }
        }
    }
}

/// What a fresh list says about the plan's pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assessment {
    /// Requests to send now.
    pub work: Vec<DeleteWork>,
    /// Plan pods that no longer exist.
    pub gone: BTreeSet<String>,
    /// Plan pods being deleted (deletionTimestamp set) that hold no finalizer
    /// of Argo's: the kubelet or the API server will remove them; wait.
    pub terminating: BTreeSet<String>,
}

impl Assessment {
    /// True once every plan pod is gone: the reset workflow may be written.
    pub fn all_gone(&self, plan_len: usize) -> bool {
        self.gone.len() == plan_len
    }

    /// Takes out of the work the single deletes of plan pods Argo has not
    /// finished with, and returns them (name, UID): pods `owner` (the live
    /// workflow's UID) owns that are still labelled completed=false.
    ///
    /// Argo v4.1.4 labels a finished pod completed=true from a clean-up
    /// queue keyed by the pod's name, seconds later (rate limited to 10 a
    /// second after a burst of 100). Deleted before that, the pod is
    /// re-created by Argo under the same name, the queued label lands on the
    /// new pod, Argo's informer (completed=false only) drops it and its node
    /// stays Pending for good. The label is also the patch that removes
    /// Argo's status finalizer, where Argo sets one. A pod without the label,
    /// or owned by nothing, is in no queue of Argo's: it does not wait. The
    /// bulk request needs nothing here: its selectors take completed=true
    /// pods only.
    pub fn settle(&mut self, listed: &[Listed], owner: &str) -> BTreeMap<String, String> {
        let unsettled: BTreeMap<&str, &str> = listed
            .iter()
            .filter(|p| p.unsettled && p.owners.iter().any(|o| o == owner))
            .map(|p| (p.name.as_str(), p.uid.as_str()))
            .collect();
        let mut settling = BTreeMap::new();
        self.work.retain(|work| match work {
            DeleteWork::Pod { name, uid }
                if unsettled.get(name.as_str()) == Some(&uid.as_str()) =>
            {
                settling.insert(name.clone(), uid.clone());
                false
            }
            _ => true,
        });
        settling
    }
}

/// A plan pod that came back: after the tracker saw it gone, or under a new
/// UID. Someone else created it; deleting it would break rule 3 and resetting
/// the workflow over it would break rule 2, so the request must stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "pod {pod} was recreated (new UID {uid}) while its workflow was being retried; rewind deletes only the pods it planned to delete, so it stopped: find out what recreates it, then request the retry again"
)]
pub struct Recreated {
    pub pod: String,
    pub uid: String,
}

/// Follows one request's plan pods across successive lists: the UID each had
/// when first seen, and which are gone.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    plan: BTreeSet<String>,
    /// Plan pods by name, as the lists showed them.
    seen: BTreeMap<String, Seen>,
}

/// A plan pod as the lists showed it.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    /// Listed, with the UID it had when first seen.
    Present(String),
    /// Seen gone; with the UID it had, if a list showed it before.
    Gone(Option<String>),
}

impl Tracker {
    pub fn new(plan: impl IntoIterator<Item = String>) -> Self {
        Tracker {
            plan: plan.into_iter().collect(),
            seen: BTreeMap::new(),
        }
    }

    /// True when `pod` is a plan pod seen gone, as it was before: a list at
    /// an older revision (the workflow's, read again after someone wrote
    /// it) shows it as history. A UID is never reused, so it is no
    /// recreated pod, and it stays gone.
    fn is_history(&self, pod: &Listed) -> bool {
        matches!(self.seen.get(&pod.name), Some(Seen::Gone(Some(uid))) if *uid == pod.uid)
    }

    pub fn plan(&self) -> &BTreeSet<String> {
        &self.plan
    }

    /// True when `pod`, with this UID, is a plan pod the last list showed.
    pub fn holds(&self, pod: &str, uid: &str) -> bool {
        matches!(self.seen.get(pod), Some(Seen::Present(seen)) if seen == uid)
    }

    /// Plan pods no list has shown gone yet.
    pub fn left(&self) -> BTreeSet<String> {
        self.plan
            .iter()
            .filter(|name| !matches!(self.seen.get(*name), Some(Seen::Gone(_))))
            .cloned()
            .collect()
    }

    /// True when the last list showed every plan pod gone.
    pub fn all_seen_gone(&self) -> bool {
        self.plan
            .iter()
            .all(|name| matches!(self.seen.get(name), Some(Seen::Gone(_))))
    }

    /// Adds pods a re-plan found (after the workflow changed under us).
    pub fn extend(&mut self, pods: impl IntoIterator<Item = String>) {
        self.plan.extend(pods);
    }

    /// Assesses a fresh list (see [`assess`]), first checking that no plan
    /// pod was recreated since an earlier list.
    pub fn assess(
        &mut self,
        workflow: &str,
        listed: &[Listed],
        allow_bulk: bool,
    ) -> Result<Assessment, Recreated> {
        let current: Vec<Listed>;
        let listed = if listed.iter().any(|p| self.is_history(p)) {
            current = listed
                .iter()
                .filter(|p| !self.is_history(p))
                .cloned()
                .collect();
            &current[..]
        } else {
            listed
        };
        let assessment = assess(workflow, &self.plan, listed, allow_bulk);
        let uids: BTreeMap<&str, &str> = listed
            .iter()
            .map(|p| (p.name.as_str(), p.uid.as_str()))
            .collect();
        let now: Vec<(&String, Option<&str>)> = self
            .plan
            .iter()
            .map(|name| {
                (
                    name,
                    if assessment.gone.contains(name) {
                        None
                    } else {
                        uids.get(name.as_str()).copied()
                    },
                )
            })
            .collect();
        for &(name, uid) in &now {
            let came_back = match (self.seen.get(name), uid) {
                (Some(Seen::Gone(_)), Some(_)) => true,
                (Some(Seen::Present(before)), Some(uid)) => before != uid,
                _ => false,
            };
            if came_back {
                return Err(Recreated {
                    pod: name.clone(),
                    uid: uid.unwrap_or_default().to_owned(),
                });
            }
        }
        for (name, uid) in now {
            let now = match (uid, self.seen.remove(name)) {
                (Some(uid), _) => Seen::Present(uid.to_owned()),
                (None, Some(Seen::Present(before))) => Seen::Gone(Some(before)),
                (None, Some(Seen::Gone(before))) => Seen::Gone(before),
                (None, None) => Seen::Gone(None),
            };
            self.seen.insert(name.clone(), now);
        }
        Ok(assessment)
    }
}

/// A request's count of deleted plan pods, for its status: the pods fresh
/// lists show gone, and those of each answered work item (removed, released,
/// already gone, or replaced by a pod that is not ours). Kept as names, so it
/// counts no pod twice, never goes back (a pod whose delete was accepted may
/// still be listed while it terminates) and never passes the plan's size.
/// A bulk request cut short says nothing of its pods; the next list does.
/// Apart, the plan pods a watch saw removed while a bulk request runs,
/// until a list or an answer confirms them.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    deleted: BTreeSet<String>,
    /// Pods of the bulk requests cut short since the last list.
    cut: BTreeSet<String>,
    watched: BTreeSet<String>,
}

impl Progress {
    /// Plan pods counted as deleted.
    pub fn deleted(&self) -> usize {
        self.deleted.len()
    }

    /// Plan pods a watch saw removed that are not yet counted as deleted.
    pub fn watched(&self) -> usize {
        self.watched.len()
    }

    /// Notes plan pod `pod` seen removed (the caller checked its UID).
    pub fn seen_removed(&mut self, pod: String) {
        if !self.deleted.contains(&pod) {
            self.watched.insert(pod);
        }
    }

    /// Counts the plan pods a fresh list found `gone`. Returns, if bulk
    /// requests were cut short since the previous list, how many of their
    /// pods are gone now.
    pub fn listed(&mut self, gone: &BTreeSet<String>) -> Option<usize> {
        self.deleted.extend(gone.iter().cloned());
        // What the watch saw and the list does not confirm was recreated:
        // the tracker stops the request.
        self.watched.clear();
        if self.cut.is_empty() {
            return None;
        }
        let removed = self.cut.intersection(gone).count();
        self.cut.clear();
        Some(removed)
    }

    /// Counts the pods of `work`, answered: none of them is the plan's pod
    /// any more.
    pub fn answered(&mut self, plan: &BTreeSet<String>, work: &DeleteWork) {
        for pod in work.pods() {
            if plan.contains(pod) {
                self.watched.remove(pod);
                self.deleted.insert(pod.to_owned());
            }
        }
    }

    /// Notes bulk `work` cut short: some of its pods may be gone.
    pub fn cut_short(&mut self, work: &DeleteWork) {
        self.cut.extend(work.pods().into_iter().map(str::to_owned));
    }
}

/// Decides the work for `plan_pods` given `listed`, every pod currently
/// labelled with the workflow's name (from one list, not a cache).
///
/// `allow_bulk` lets the caller turn off DeleteCollection (tests, benchmarks,
/// or clusters that forbid it).
pub fn assess(
    workflow: &str,
    plan_pods: &BTreeSet<String>,
    listed: &[Listed],
    allow_bulk: bool,
) -> Assessment {
    let listed: BTreeMap<&str, &Listed> = listed
        .iter()
        .filter(|p| p.workflow.as_deref() == Some(workflow))
        .map(|p| (p.name.as_str(), p))
        .collect();

    let mut out = Assessment::default();
    let mut deletable: Vec<(&str, &str, &Listed)> = Vec::new();
    for name in plan_pods {
        let Some(pod) = listed.get(name.as_str()) else {
            out.gone.insert(name.clone());
            continue;
        };
        let uid = pod.uid.as_str();
        if pod.terminating.is_some() {
            if let Some(index) = pod.status_finalizer {
                out.work.push(DeleteWork::Finalizer {
                    name: name.clone(),
                    uid: uid.to_owned(),
                    index,
                });
            } else {
                out.terminating.insert(name.clone());
            }
        } else {
            deletable.push((name.as_str(), uid, pod));
        }
    }

    // The bulk request selects only pods Argo has finished with
    // (completed=true). Argo v4.1.4 creates every pod with completed=false
    // (workflowpod.go) and relabels it true only after it has written the
    // workflow (pod/queue.go, operator.go), so a pod created or recreated after
    // this list never matches: the request is exact when every listed pod it
    // may select is a plan pod. A listed outsider whose relabelling Argo may
    // still have queued (it carries Argo's node annotations) counts as
    // selected; any other unfinished outsider cannot match and does not
    // stop the bulk path.
    let outsiders = listed
        .iter()
        .any(|(name, p)| may_become_selected(p) && !plan_pods.contains(*name));
    let in_bulk: Vec<String> = deletable
        .iter()
        .filter(|(_, _, p)| bulk_selects(p))
        .map(|(n, _, _)| n.to_string())
        .collect();
    // Every listed plan pod, terminating ones too: the selectors still pick
    // a pod being deleted, and deleting it again is harmless.
    let uids: BTreeSet<String> = plan_pods
        .iter()
        .filter_map(|name| listed.get(name.as_str()))
        .map(|p| p.uid.clone())
        .collect();
    // One request for one pod gains nothing over a precise single delete.
    let use_bulk = allow_bulk && !outsiders && in_bulk.len() > 1;
    if use_bulk {
        let (label_selector, field_selector) = bulk_selectors(workflow);
        out.work.push(DeleteWork::Bulk {
            workflow: workflow.to_owned(),
            label_selector,
            field_selector,
            pods: in_bulk,
            uids,
        });
    }
    for (name, uid, pod) in deletable {
        if !(use_bulk && bulk_selects(pod)) {
            out.work.push(DeleteWork::Pod {
                name: name.to_owned(),
                uid: uid.to_owned(),
            });
        }
    }
    out
}

/// The label and field selectors of a bulk delete of `workflow`'s pods:
/// finished with by Argo, and not succeeded.
pub fn bulk_selectors(workflow: &str) -> (String, String) {
    (
        format!("{}={workflow},{}=true", labels::WORKFLOW, labels::COMPLETED),
        format!("status.phase!={SUCCEEDED}"),
    )
}

/// The longest node selector one part of a split bulk request may carry: a
/// URL of a few tens of KiB is fine for the API server; past it (hundreds of
/// nodes) the bulk request stays whole.
const MAX_NODE_SELECTOR: usize = 32 * 1024;

/// The field that spreads one workflow's pods: the node each ran on.
const NODE_FIELD: &str = "spec.nodeName";

/// One part of a bulk request split by node: `node_selector` (field selector
/// terms on `spec.nodeName`, empty for "all") and the pods the hint places
/// in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePart {
    pub node_selector: String,
    pub pods: Vec<String>,
}

/// Splits a bulk request of `pods` into at most `parallelism` parts by the
/// node each pod ran on (`nodes`, a hint: Argo's `hostNodeName`), so the API
/// server deletes them on that many threads instead of one.
///
/// Exactness needs no hint: every part is the exact bulk request narrowed by
/// one more field selector term, so it selects a subset of what the whole one
/// would. The hint only balances the parts and names their pods. The parts
/// cover every pod the whole request would select: a field selector term can
/// name one node (`=`) or exclude some (`!=`), never a set, so a part of one
/// node is `spec.nodeName=X`, a part of several excludes every known node
/// outside it (and the empty node), and the last part excludes the nodes of
/// all the others: it takes its own nodes, pods never scheduled, and nodes the
/// hint does not know. A pod on an unknown node may be selected by more than
/// one part; the second delete finds it gone, which DeleteCollection ignores.
pub fn split_by_node(
    pods: &[String],
    parallelism: usize,
    nodes: &BTreeMap<String, String>,
) -> Vec<NodePart> {
    let whole = || {
        vec![NodePart {
            node_selector: String::new(),
            pods: pods.to_vec(),
        }]
    };
    let mut load: BTreeMap<&str, usize> = BTreeMap::new();
    for pod in pods {
        if let Some(node) = nodes.get(pod).filter(|n| !n.is_empty()) {
            *load.entry(node.as_str()).or_default() += 1;
        }
    }
    let k = parallelism.min(load.len());
    if k < 2 {
        return whole();
    }
    // Largest nodes first, each to the lightest group: balanced within the
    // largest node's size.
    let mut by_size: Vec<(&str, usize)> = load.iter().map(|(n, c)| (*n, *c)).collect();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut groups: Vec<(usize, BTreeSet<&str>)> = vec![(0, BTreeSet::new()); k];
    for (node, count) in by_size {
        let lightest = (0..k).min_by_key(|&g| (groups[g].0, g)).unwrap_or(0);
        groups[lightest].0 += count;
        groups[lightest].1.insert(node);
    }
    // The lightest group is the catch-all, last: it also takes what the hint
    // misses.
    let rest = (0..k)
        .min_by_key(|&g| (groups[g].0, std::cmp::Reverse(g)))
        .unwrap_or(k - 1);
    let rest_group = groups.remove(rest);
    groups.push(rest_group);
    let not = |node: &str| format!("{NODE_FIELD}!={node}");
    let mut parts: Vec<NodePart> = groups
        .iter()
        .enumerate()
        .map(|(g, (_, members))| {
            let terms: Vec<String> = if g == k - 1 {
                groups[..g]
                    .iter()
                    .flat_map(|(_, m)| m.iter().map(|n| not(n)))
                    .collect()
            } else if let [node] = Vec::from_iter(members.iter()).as_slice() {
                vec![format!("{NODE_FIELD}={node}")]
            } else {
                // The empty node first: pods never scheduled belong to the last part.
                std::iter::once(not(""))
                    .chain(
                        load.keys()
                            .filter(|n| !members.contains(*n))
                            .map(|n| not(n)),
                    )
                    .collect()
            };
            NodePart {
                node_selector: terms.join(","),
                pods: Vec::new(),
            }
        })
        .collect();
    if parts
        .iter()
        .any(|p| p.node_selector.len() > MAX_NODE_SELECTOR)
    {
        return whole();
    }
    for pod in pods {
        let node = nodes.get(pod).map(String::as_str).unwrap_or_default();
        let g = groups
            .iter()
            .position(|(_, m)| m.contains(node))
            .unwrap_or(k - 1);
        parts[g].pods.push(pod.clone());
    }
    parts
}

/// `work` with each bulk request split by node (see [`split_by_node`]).
pub fn split_bulk(
    work: Vec<DeleteWork>,
    parallelism: usize,
    nodes: &BTreeMap<String, String>,
) -> Vec<DeleteWork> {
    let mut out = Vec::with_capacity(work.len());
    for item in work {
        let DeleteWork::Bulk {
            workflow,
            label_selector,
            field_selector,
            pods,
            uids,
        } = item
        else {
            out.push(item);
            continue;
        };
        for part in split_by_node(&pods, parallelism, nodes) {
            let field_selector = match part.node_selector.as_str() {
                "" => field_selector.clone(),
                nodes => format!("{field_selector},{nodes}"),
            };
            out.push(DeleteWork::Bulk {
                workflow: workflow.clone(),
                label_selector: label_selector.clone(),
                field_selector,
                pods: part.pods,
                // Every part may take any of the proven pods: the node hint
                // only spreads them.
                uids: uids.clone(),
            });
        }
    }
    out
}

/// What the bulk request's selectors pick now (the workflow label aside).
fn bulk_selects(pod: &Listed) -> bool {
    pod.completed && !pod.succeeded
}

/// What the bulk request may pick by the time the server lists: what it picks
/// now, and Argo's own unfinished pods, which Argo may be relabelling.
fn may_become_selected(pod: &Listed) -> bool {
    bulk_selects(pod) || (pod.argos && !pod.succeeded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn meta(wf: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            labels: Some(
                [
                    (labels::WORKFLOW.to_string(), wf.to_string()),
                    (labels::COMPLETED.to_string(), "true".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        }
    }

    fn pod(wf: &str, name: &str, phase: &str) -> Listed {
        Listed::new(meta(wf, name), phase == SUCCEEDED).unwrap()
    }

    /// A pod Argo has not relabelled completed=true (yet), made by Argo
    /// (with its node annotations) or by someone else.
    fn unfinished(mut p: Listed, argos: bool) -> Listed {
        p.completed = false;
        p.argos = argos;
        p
    }

    fn bulk(wf: &str, pods: &[&str]) -> DeleteWork {
        DeleteWork::Bulk {
            workflow: wf.into(),
            label_selector: format!("{}={wf},{}=true", labels::WORKFLOW, labels::COMPLETED),
            field_selector: "status.phase!=Succeeded".into(),
            pods: pods.iter().map(|p| p.to_string()).collect(),
            uids: pods.iter().map(|p| format!("uid-{p}")).collect(),
        }
    }

    /// `work` (bulk) proven by a list showing the plan pods `shown`.
    fn proven_by(mut work: DeleteWork, shown: &[&str]) -> DeleteWork {
        if let DeleteWork::Bulk { uids, .. } = &mut work {
            *uids = shown.iter().map(|p| format!("uid-{p}")).collect();
        }
        work
    }

    #[test]
    fn a_bulk_proof_holds_every_listed_plan_pod_terminating_ones_too() {
        // A pod being deleted is still selected; deleting it again is harmless,
        // so the re-proof right before the send must accept it.
        let listed = [
            pod("wf", "a", "Failed"),
            pod("wf", "b", "Failed"),
            terminating(pod("wf", "going", "Failed"), false),
        ];
        let got = assess("wf", &names(&["a", "b", "going"]), &listed, true);
        assert_eq!(
            got.work,
            vec![proven_by(bulk("wf", &["a", "b"]), &["a", "b", "going"])]
        );
    }

    fn terminating(mut p: Listed, finalizer: bool) -> Listed {
        p.terminating = Some(Box::default());
        p.status_finalizer = finalizer.then_some(1);
        p
    }

    #[test]
    fn a_listed_pod_keeps_what_the_assessment_reads() {
        let mut m = meta("wf", "a");
        m.labels
            .as_mut()
            .unwrap()
            .insert(labels::COMPLETED.into(), "false".into());
        m.annotations = Some([(labels::NODE_NAME.to_string(), "wf.a".to_string())].into());
        m.deletion_timestamp = Some(Time(Default::default()));
        m.finalizers = Some(vec!["other".into(), labels::POD_STATUS_FINALIZER.into()]);
        m.owner_references = Some(vec![
            serde_json::from_value(serde_json::json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                "name": "wf", "uid": "owner"}))
            .unwrap(),
        ]);
        let got = Listed::new(m, false).unwrap();
        let want = Listed {
            name: "a".into(),
            uid: "uid-a".into(),
            workflow: Some("wf".into()),
            completed: false,
            unsettled: true,
            argos: true,
            terminating: Some(Box::new(Terminating {
                since: "1970-01-01T00:00:00Z".into(),
                finalizers: vec!["other".into(), labels::POD_STATUS_FINALIZER.into()],
            })),
            status_finalizer: Some(1),
            owners: vec!["owner".into()],
            succeeded: false,
        };
        assert_eq!(got, want);
        assert!(pod("wf", "b", "Failed").completed);
        assert!(!pod("wf", "b", "Failed").unsettled);
        let mut unlabelled = meta("wf", "c");
        unlabelled
            .labels
            .as_mut()
            .unwrap()
            .remove(labels::COMPLETED);
        let unlabelled = Listed::new(unlabelled, false).unwrap();
        assert!(!unlabelled.completed && !unlabelled.unsettled);
        assert_eq!(Listed::new(ObjectMeta::default(), false), None);
    }

    /// `p` labelled completed=false (as Argo creates its pods) and owned by `owner`.
    fn argos_unsettled(mut p: Listed, owner: &str) -> Listed {
        p.completed = false;
        p.unsettled = true;
        p.argos = true;
        p.owners = vec![owner.into()];
        p
    }

    #[test]
    fn plan_pods_argo_has_not_finished_with_wait_and_others_go() {
        // "late" is the workflow's, labelled completed=false: Argo's clean-up
        // queue will label it by name, so deleting it now could send the label
        // to the pod Argo re-creates. "orphan" is owned by nothing and
        // "unlabelled" carries no completed label: nothing of Argo's labels
        // them, so they go. The bulk request is untouched (its selector takes
        // only completed=true pods).
        let mut orphan = argos_unsettled(pod("wf", "orphan", "Failed"), "wf-uid");
        orphan.owners.clear();
        let mut unlabelled = argos_unsettled(pod("wf", "unlabelled", "Failed"), "wf-uid");
        unlabelled.unsettled = false;
        let listed = [
            pod("wf", "a", "Failed"),
            pod("wf", "b", "Failed"),
            argos_unsettled(pod("wf", "late", "Failed"), "wf-uid"),
            orphan,
            unlabelled,
        ];
        let plan = names(&["a", "b", "late", "orphan", "unlabelled"]);
        let mut got = assess("wf", &plan, &listed, true);
        let settling = got.settle(&listed, "wf-uid");
        assert_eq!(
            settling,
            BTreeMap::from([("late".to_string(), "uid-late".to_string())])
        );
        let single = |n: &str| DeleteWork::Pod {
            name: n.into(),
            uid: format!("uid-{n}"),
        };
        assert_eq!(
            got.work,
            vec![
                proven_by(
                    bulk("wf", &["a", "b"]),
                    &["a", "b", "late", "orphan", "unlabelled"]
                ),
                single("orphan"),
                single("unlabelled"),
            ]
        );
        // Another owner's UID (an archived retry passes none): nothing waits.
        let mut again = assess("wf", &plan, &listed, true);
        assert!(again.settle(&listed, "other").is_empty());
        assert_eq!(again.work.len(), 4);
    }

    fn names(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bulk_when_the_selector_selects_only_plan_pods() {
        let listed = [
            pod("wf", "a", "Failed"),
            pod("wf", "b", "Failed"),
            pod("wf", "ok", "Succeeded"),
        ];
        let got = assess("wf", &names(&["a", "b", "gone"]), &listed, true);
        assert_eq!(got.work, vec![bulk("wf", &["a", "b"])]);
        assert_eq!(got.gone, names(&["gone"]));
    }

    #[test]
    fn unrelabelled_plan_pods_are_deleted_singly_and_unfinished_outsiders_do_not_block() {
        // "late" is planned but Argo never marked it completed: the bulk
        // selector cannot reach it. "other" is someone else's pod with the
        // workflow's label, also unfinished: the bulk selector cannot reach it
        // either, so it does not stop the bulk path.
        let listed = [
            pod("wf", "a", "Failed"),
            pod("wf", "b", "Failed"),
            unfinished(pod("wf", "late", "Failed"), true),
            unfinished(pod("wf", "other", "Failed"), false),
        ];
        let got = assess("wf", &names(&["a", "b", "late"]), &listed, true);
        assert_eq!(
            got.work,
            vec![
                proven_by(bulk("wf", &["a", "b"]), &["a", "b", "late"]),
                DeleteWork::Pod {
                    name: "late".into(),
                    uid: "uid-late".into()
                },
            ]
        );
    }

    #[test]
    fn an_outsider_argo_may_still_relabel_blocks_bulk() {
        // Argo relabels its pods after it writes the finished workflow: this
        // failed attempt outside the plan may match by the time the server lists.
        let listed = [
            pod("wf", "a", "Failed"),
            pod("wf", "b", "Failed"),
            unfinished(pod("wf", "kept", "Failed"), true),
            unfinished(pod("wf", "ok", "Succeeded"), true),
        ];
        let got = assess("wf", &names(&["a", "b"]), &listed, true);
        assert!(
            got.work.iter().all(|w| matches!(w, DeleteWork::Pod { .. })),
            "{:?}",
            got.work
        );
        // A succeeded one never matches the field selector: bulk is fine.
        let got = assess("wf", &names(&["a", "b"]), &listed[..2], true);
        assert_eq!(got.work, vec![bulk("wf", &["a", "b"])]);
        let mut with_ok = listed[..2].to_vec();
        with_ok.push(listed[3].clone());
        assert_eq!(
            assess("wf", &names(&["a", "b"]), &with_ok, true).work,
            vec![bulk("wf", &["a", "b"])]
        );
    }

    #[test]
    fn an_outsider_matching_the_selector_forces_single_deletes() {
        // "keep" failed but is not in the plan (e.g. a retried attempt whose retry succeeded).
        let listed = [
            pod("wf", "a", "Failed"),
            pod("wf", "b", "Error"),
            pod("wf", "keep", "Failed"),
        ];
        let got = assess("wf", &names(&["a", "b"]), &listed, true);
        assert_eq!(
            got.work,
            vec![
                DeleteWork::Pod {
                    name: "a".into(),
                    uid: "uid-a".into()
                },
                DeleteWork::Pod {
                    name: "b".into(),
                    uid: "uid-b".into()
                },
            ]
        );
    }

    #[test]
    fn succeeded_plan_pods_are_deleted_singly_beside_a_bulk() {
        let listed = [
            pod("wf", "a", "Failed"),
            pod("wf", "b", "Failed"),
            pod("wf", "s", "Succeeded"),
        ];
        let got = assess("wf", &names(&["a", "b", "s"]), &listed, true);
        assert!(matches!(&got.work[0], DeleteWork::Bulk { pods, .. } if pods == &["a", "b"]));
        assert_eq!(
            got.work[1],
            DeleteWork::Pod {
                name: "s".into(),
                uid: "uid-s".into()
            }
        );
        assert_eq!(got.work.len(), 2);
    }

    #[test]
    fn pods_of_other_workflows_are_ignored() {
        // Only the label decides membership: a similar name in another workflow is not ours.
        let listed = [pod("wf", "wf-1", "Failed"), pod("wf-2", "wf-1x", "Failed")];
        let got = assess("wf", &names(&["wf-1"]), &listed, true);
        assert_eq!(
            got.work,
            vec![DeleteWork::Pod {
                name: "wf-1".into(),
                uid: "uid-wf-1".into()
            }]
        );
    }

    #[test]
    fn terminating_pods_are_released_or_awaited() {
        let listed = [
            terminating(pod("wf", "held", "Failed"), true),
            terminating(pod("wf", "going", "Failed"), false),
        ];
        let got = assess("wf", &names(&["held", "going"]), &listed, true);
        assert_eq!(
            got.work,
            vec![DeleteWork::Finalizer {
                name: "held".into(),
                uid: "uid-held".into(),
                index: 1
            }]
        );
        assert_eq!(got.terminating, names(&["going"]));
        assert!(!got.all_gone(2));
    }

    #[test]
    fn a_terminating_outsider_still_blocks_bulk() {
        let listed = [
            pod("wf", "a", "Failed"),
            pod("wf", "b", "Failed"),
            terminating(pod("wf", "x", "Failed"), false),
        ];
        let got = assess("wf", &names(&["a", "b"]), &listed, true);
        assert!(
            got.work.iter().all(|w| matches!(w, DeleteWork::Pod { .. })),
            "{:?}",
            got.work
        );
    }

    #[test]
    fn bulk_can_be_disabled() {
        let listed = [pod("wf", "a", "Failed"), pod("wf", "b", "Failed")];
        let got = assess("wf", &names(&["a", "b"]), &listed, false);
        assert!(got.work.iter().all(|w| matches!(w, DeleteWork::Pod { .. })));
    }

    #[test]
    fn tracker_stops_on_a_recreated_pod() {
        let mut t = Tracker::new(names(&["a", "b"]));
        let first = t.assess("wf", &[pod("wf", "a", "Failed")], true).unwrap();
        assert_eq!(first.gone, names(&["b"]));
        // Same pod again: fine.
        t.assess("wf", &[pod("wf", "a", "Failed")], true).unwrap();
        // "b" was gone and is back.
        let err = t
            .assess(
                "wf",
                &[pod("wf", "a", "Failed"), pod("wf", "b", "Failed")],
                true,
            )
            .unwrap_err();
        assert_eq!(err.pod, "b");
        // "a" under a new UID.
        let mut t = Tracker::new(names(&["a"]));
        t.assess("wf", &[pod("wf", "a", "Failed")], true).unwrap();
        let mut again = pod("wf", "a", "Failed");
        again.uid = "new".into();
        assert_eq!(t.assess("wf", &[again], true).unwrap_err().uid, "new");
    }

    /// Issue 47, finding 4: after a conflict the workflow is read again and
    /// its pods listed at its revision, older than some deletes: those pods
    /// show under their own UIDs. They are history, not recreated, and stay
    /// gone; the same name under a new UID still stops the request.
    #[test]
    fn tracker_takes_a_deleted_pod_in_an_older_list_as_history() {
        let mut t = Tracker::new(names(&["a", "b"]));
        let both = [pod("wf", "a", "Failed"), pod("wf", "b", "Failed")];
        t.assess("wf", &both, true).unwrap();
        assert!(t.assess("wf", &[], true).unwrap().gone == names(&["a", "b"]));
        let older = t
            .assess("wf", &[pod("wf", "a", "Failed")], true)
            .expect("a pod seen gone, listed at an older revision, is not recreated");
        assert_eq!(older.gone, names(&["a", "b"]));
        assert!(older.work.is_empty(), "{:?}", older.work);
        assert!(t.all_seen_gone());
        let mut again = pod("wf", "b", "Failed");
        again.uid = "new".into();
        assert_eq!(t.assess("wf", &[again], true).unwrap_err().uid, "new");
    }

    #[test]
    fn progress_counts_each_plan_pod_once_and_never_goes_back() {
        let plan = names(&["a", "b", "c", "d"]);
        let mut p = Progress::default();
        assert_eq!(p.listed(&names(&["a"])), None);
        // "b" deleted singly (accepted, terminating), then a bulk of "c", "d".
        let single = DeleteWork::Pod {
            name: "b".into(),
            uid: "u".into(),
        };
        p.answered(&plan, &single);
        p.answered(&plan, &bulk("wf", &["c", "d", "outsider"]));
        assert_eq!(p.deleted(), 4);
        // A later list still shows "b" terminating and "a" gone again: no change, no double count.
        assert_eq!(p.listed(&names(&["a", "c", "d"])), None);
        p.answered(&plan, &single);
        assert_eq!(p.deleted(), 4);
    }

    #[test]
    fn a_bulk_cut_short_is_counted_from_the_next_list() {
        let plan = names(&["a", "b", "c", "d"]);
        let mut p = Progress::default();
        p.listed(&names(&["a"]));
        let work = bulk("wf", &["b", "c", "d"]);
        p.cut_short(&work);
        // Cut short: nothing counted until a list says which went.
        assert_eq!(p.deleted(), 1);
        assert_eq!(p.listed(&names(&["a", "b"])), Some(1));
        assert_eq!(p.deleted(), 2);
        // The list after the next bulk, cut short without removing anything.
        p.cut_short(&bulk("wf", &["c", "d"]));
        assert_eq!(p.listed(&names(&["a", "b"])), Some(0));
        // Only the cut since the last list counts.
        assert_eq!(p.listed(&names(&["a", "b", "c"])), None);
        p.answered(&plan, &bulk("wf", &["d"]));
        assert_eq!(p.deleted(), 4);
    }

    #[test]
    fn pods_seen_removed_count_apart_until_confirmed() {
        let plan = names(&["a", "b", "c"]);
        let mut t = Tracker::new(plan.clone());
        let listed = [pod("wf", "a", "Failed"), pod("wf", "b", "Failed")];
        t.assess("wf", &listed, true).unwrap();
        assert!(t.holds("a", "uid-a"));
        assert!(!t.holds("a", "other"), "another pod under the name");
        assert!(!t.holds("c", "uid-c"), "gone at the list");
        let mut p = Progress::default();
        p.listed(&names(&["c"]));
        p.seen_removed("a".into());
        p.seen_removed("a".into());
        p.seen_removed("c".into());
        assert_eq!((p.deleted(), p.watched()), (1, 1));
        // The bulk request's answer confirms what the watch saw.
        p.answered(&plan, &bulk("wf", &["a", "b"]));
        assert_eq!((p.deleted(), p.watched()), (3, 0));
    }

    /// What a part's node selector selects, as the API server reads it:
    /// every term must hold.
    fn part_selects(part: &NodePart, node: &str) -> bool {
        part.node_selector
            .split(',')
            .filter(|t| !t.is_empty())
            .all(|term| match term.split_once("!=") {
                Some((field, value)) => field == NODE_FIELD && node != value,
                None => term.split_once('=') == Some((NODE_FIELD, node)),
            })
    }

    /// `pods` spread round-robin over `nodes` nodes.
    fn spread(pods: usize, nodes: usize) -> (Vec<String>, BTreeMap<String, String>) {
        let names: Vec<String> = (0..pods).map(|i| format!("p{i:03}")).collect();
        let hint = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), format!("node-{}", i % nodes)))
            .collect();
        (names, hint)
    }

    #[test]
    fn a_split_selects_each_known_node_once_and_balances() {
        let (pods, hint) = spread(80, 8);
        let parts = split_by_node(&pods, 4, &hint);
        assert_eq!(parts.len(), 4);
        for part in &parts {
            assert_eq!(part.pods.len(), 20, "{part:?}");
            // The pods the hint places in a part are the ones it selects.
            for pod in &part.pods {
                assert!(part_selects(part, &hint[pod]), "{pod} {part:?}");
            }
        }
        for node in (0..8).map(|i| format!("node-{i}")) {
            let selecting = parts.iter().filter(|p| part_selects(p, &node)).count();
            assert_eq!(selecting, 1, "{node}");
        }
        let named: BTreeSet<&String> = parts.iter().flat_map(|p| &p.pods).collect();
        assert_eq!(named.len(), 80);
    }

    #[test]
    fn unscheduled_pods_and_unknown_nodes_fall_to_the_last_part() {
        let (mut pods, mut hint) = spread(40, 4);
        pods.push("unscheduled".into());
        pods.push("no-hint".into());
        hint.insert("unscheduled".into(), String::new());
        let parts = split_by_node(&pods, 2, &hint);
        let last = parts.last().unwrap();
        assert!(last.pods.contains(&"unscheduled".into()));
        assert!(last.pods.contains(&"no-hint".into()));
        // An unscheduled pod: only the last part selects it.
        let selecting: Vec<bool> = parts.iter().map(|p| part_selects(p, "")).collect();
        assert_eq!(selecting, [false, true]);
        // A node the hint never named: the last part selects it, so no pod
        // the whole request would delete is left out.
        assert!(part_selects(last, "node-elsewhere"));
    }

    #[test]
    fn a_one_node_part_names_its_node_and_several_exclude_the_others() {
        let (pods, hint) = spread(30, 3);
        let parts = split_by_node(&pods, 3, &hint);
        assert_eq!(parts[0].node_selector, "spec.nodeName=node-0");
        assert_eq!(parts[1].node_selector, "spec.nodeName=node-1");
        assert_eq!(
            parts[2].node_selector,
            "spec.nodeName!=node-0,spec.nodeName!=node-1"
        );
        let (pods, hint) = spread(40, 4);
        let parts = split_by_node(&pods, 2, &hint);
        assert_eq!(
            parts[0].node_selector,
            "spec.nodeName!=,spec.nodeName!=node-1,spec.nodeName!=node-3"
        );
        assert_eq!(
            parts[1].node_selector,
            "spec.nodeName!=node-0,spec.nodeName!=node-2"
        );
    }

    #[test]
    fn no_split_for_one_part_one_node_no_hint_or_a_huge_selector() {
        let whole = |pods: &[String]| {
            vec![NodePart {
                node_selector: String::new(),
                pods: pods.to_vec(),
            }]
        };
        let (pods, hint) = spread(20, 4);
        assert_eq!(split_by_node(&pods, 1, &hint), whole(&pods));
        assert_eq!(split_by_node(&pods, 4, &BTreeMap::new()), whole(&pods));
        let (pods, hint) = spread(20, 1);
        assert_eq!(split_by_node(&pods, 4, &hint), whole(&pods));
        // Thousands of long node names: the URL would be too long.
        let hint: BTreeMap<String, String> = (0..2000)
            .map(|i| (format!("p{i}"), format!("{i}-{}", "n".repeat(60))))
            .collect();
        let pods: Vec<String> = hint.keys().cloned().collect();
        assert_eq!(split_by_node(&pods, 4, &hint), whole(&pods));
    }

    #[test]
    fn split_bulk_narrows_the_exact_request_and_keeps_single_work() {
        let (pods, hint) = spread(4, 2);
        let single = DeleteWork::Pod {
            name: "s".into(),
            uid: "u".into(),
        };
        let names: Vec<&str> = pods.iter().map(String::as_str).collect();
        let work = split_bulk(vec![bulk("wf", &names), single.clone()], 2, &hint);
        let (labels, fields) = bulk_selectors("wf");
        let uids: BTreeSet<String> = names.iter().map(|p| format!("uid-{p}")).collect();
        assert_eq!(
            work,
            vec![
                DeleteWork::Bulk {
                    workflow: "wf".into(),
                    label_selector: labels.clone(),
                    field_selector: format!("{fields},spec.nodeName=node-0"),
                    pods: vec!["p000".into(), "p002".into()],
                    uids: uids.clone(),
                },
                DeleteWork::Bulk {
                    workflow: "wf".into(),
                    label_selector: labels,
                    field_selector: format!("{fields},spec.nodeName!=node-0"),
                    pods: vec!["p001".into(), "p003".into()],
                    uids,
                },
                single,
            ]
        );
    }

    #[test]
    fn everything_gone_means_commit() {
        let got = assess("wf", &names(&["a", "b"]), &[], true);
        assert!(got.work.is_empty());
        assert!(got.all_gone(2));
    }
}
