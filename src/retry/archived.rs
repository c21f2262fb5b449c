//! The retry of an archived workflow (one no longer in the cluster), in the
//! order of Argo's server (v4.1.4 `RetryArchivedWorkflow`): read the archived
//! row, refuse if a workflow of that name exists live, plan, delete the
//! leftover pods, create the workflow. rewind's rules on top:
//!
//! - Deletions go through the shared queue (interactive class) and budget,
//!   and only pods whose owner reference is the archived workflow's UID are
//!   leftovers: a pod of another workflow of the same name is never touched.
//! - The workflow is created only once every plan pod is gone (rule 2:
//!   Argo's controller would adopt a stale pod of the same name).
//! - Exactly one create (rule 4): the status says Committing, naming the
//!   workflow, before the create is sent, and names the created workflow's
//!   UID as soon as it answers; the created workflow carries [`CREATED_BY`]
//!   naming the WorkflowRetry's UID, and the finalizer [`CREATING`] until that
//!   UID is recorded, so it cannot vanish before. A request resumed in
//!   Committing ends from what the cluster and its status say, and creates
//!   only a workflow that was never created (see [`Job::resume`]).

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, PatchParams, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::argo::db::{ArgoDatabase, DbError};
use crate::argo::offload::{self, OffloadError};
use crate::argo::plan::{Plan, PlanError};
use crate::argo::workflow::Workflow;
use crate::engine::drive::{Count, DeleteError, Deletion, Sink};
use crate::engine::fault::{self, api_code};
use crate::engine::workers::{RequestKey, without_finalizer};
use crate::protocol::crd::{CREATED_BY, CREATING};
use crate::protocol::request::{DENIED, EXISTS, RetryPhase, workflowretry_token};
use crate::retry::admission::{Admitted, Planning};
use crate::retry::object::ObjectStatus;
use crate::retry::report;
use crate::telemetry::metrics::{RetryKind, Step as Metered};

/// Why an archived retry did not (yet) create its workflow.
#[derive(Debug, thiserror::Error)]
pub enum ArchivedError {
    #[error(
        "this controller has no workflow archive: configure Argo's persistence (archive: true) in the ConfigMap given by --argo-configmap"
    )]
    NoArchive,
    #[error("reading archived workflow {uid}: {source}")]
    Read {
        uid: String,
        #[source]
        source: DbError,
    },
    #[error("copying the offloaded nodes of archived workflow {uid}: {source}")]
    CopyOffloaded {
        uid: String,
        #[source]
        source: DbError,
    },
    #[error(
        "no archived workflow with UID {uid} in Argo's workflow archive (check it with `argo archive list`); nothing was deleted"
    )]
    UnknownUid { uid: String },
    /// Argo's words: where the workflow lives is not told to someone asking
    /// in another namespace (the controller's log says it).
    #[error(
        "{DENIED}: archived workflow {uid} is not in namespace {requested}; ask in the namespace it ran in"
    )]
    OtherNamespace { uid: String, requested: String },
    /// Argo's message (its server prints the placeholder literally; rewind names the workflow).
    #[error("{EXISTS}, use argo retry {name} instead")]
    ExistsLive { name: String },
    /// Always worth trying again: the workflow keeps [`CREATING`] until then.
    #[error(
        "recording the created workflow {name} (UID {uid}) in the WorkflowRetry's status failed: {}; the workflow keeps finalizer {CREATING} until it is recorded",
        fault::explain(.source)
    )]
    Record {
        name: String,
        uid: String,
        #[source]
        source: kube::Error,
    },
    /// Worth trying again: another writer (Argo's controller adding its own)
    /// kept changing the finalizers between the read and the patch.
    #[error(
        "removing finalizer {CREATING} from the created workflow {name}: its finalizers changed at each of {RELEASE_ATTEMPTS} tries; trying again later"
    )]
    FinalizersChanging { name: String },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Offload(#[from] OffloadError),
    #[error(transparent)]
    Delete(#[from] DeleteError),
    #[error("{what} failed: {}", fault::explain(.source))]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl ArchivedError {
    /// Whether a later attempt may succeed (see [`fault::is_transient`]).
    pub fn is_transient(&self) -> bool {
        match self {
            ArchivedError::Read { source, .. } | ArchivedError::CopyOffloaded { source, .. } => {
                source.is_transient()
            }
            ArchivedError::Offload(e) => e.is_transient(),
            ArchivedError::Delete(e) => e.is_transient(),
            ArchivedError::Api { source, .. } => fault::is_transient(source),
            ArchivedError::Record { .. } | ArchivedError::FinalizersChanging { .. } => true,
            _ => false,
        }
    }
}

/// `ArchivedError::Api` for `what`, as a `map_err` argument.
fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ArchivedError {
    let what = what.into();
    move |source| ArchivedError::Api { what, source }
}

/// The steps of an archived retry, as the status names them.
#[derive(Clone, Copy, Debug)]
enum Step {
    Read,
    Plan,
    Delete,
    Create,
}

impl Step {
    /// Records that the step took `elapsed` in the request's status (visible
    /// at its next write).
    fn took(self, status: &mut ObjectStatus<'_>, elapsed: Duration) {
        // Milliseconds are plenty, and keep the status readable.
        let seconds = Some(elapsed.as_millis() as f64 / 1000.0);
        let shown = status.status.timings.get_or_insert_default();
        match self {
            Step::Read => shown.read_seconds = seconds,
            Step::Plan => shown.plan_seconds = seconds,
            Step::Delete => shown.delete_seconds = seconds,
            Step::Create => shown.create_seconds = seconds,
        }
    }
}

/// Retries archived workflow `uid` for the WorkflowRetry `status` reports
/// on; its message says what was done.
pub async fn run(
    status: &mut ObjectStatus<'_>,
    uid: &str,
    stop: &CancellationToken,
) -> Result<(), ArchivedError> {
    let mut job = Job::new(status, uid).ok_or(ArchivedError::NoArchive)?;
    if let Some(name) = creating(job.status)
        && job.resume(&name).await? == Resumed::Ended
    {
        return Ok(());
    }
    let archived = job.read().await?;
    let name = archived.name().to_owned();
    if let Some(done) = created_by_us(&job.workflows, &name, &job.status.uid()).await? {
        return job.found(&name, done).await;
    }
    let (planned, _admitted) = job.plan(archived, stop).await?;
    job.delete(&name, &planned, stop).await?;
    let created = job.create(&name, planned.workflow).await?;
    job.finish(&name, created);
    Ok(())
}

/// What a request that may have created its workflow found when resumed.
#[derive(Debug, PartialEq)]
enum Resumed {
    Ended,
    /// The workflow was never created: the request goes on to create it.
    NotCreated,
}

/// Tries at removing [`CREATING`] while others change the workflow's
/// finalizers (Argo's controller adds its own).
const RELEASE_ATTEMPTS: u32 = 5;

/// One archived retry, a method per step.
struct Job<'r, 'a> {
    status: &'r mut ObjectStatus<'a>,
    database: &'a dyn ArgoDatabase,
    /// The archived workflow's UID.
    uid: &'r str,
    namespace: String,
    workflows: Api<Workflow>,
    started: Instant,
    /// The archived workflow as first read, until it is planned.
    archived: Option<Workflow>,
    /// Why [`CREATING`] stays on the created workflow, when removing it
    /// failed for a reason trying again does not fix: the message says so.
    unreleased: Option<String>,
}

impl<'r, 'a> Job<'r, 'a> {
    /// `None` when the controller has no workflow archive.
    fn new(status: &'r mut ObjectStatus<'a>, uid: &'r str) -> Option<Self> {
        let ctx = status.ctx;
        let database = ctx.database.as_deref().filter(|db| db.archives())?;
        let namespace = status.namespace();
        let workflows = Api::namespaced(ctx.client(), &namespace);
        Some(Job {
            status,
            database,
            uid,
            namespace,
            workflows,
            started: Instant::now(),
            archived: None,
            unreleased: None,
        })
    }

    /// The archived workflow, refused when asked for in another namespace.
    async fn read(&mut self) -> Result<Workflow, ArchivedError> {
        let step = self
            .status
            .ctx
            .metrics
            .step(RetryKind::Archived, Metered::Read);
        let archived = read(self.database, self.uid).await?;
        Step::Read.took(self.status, step.done());
        let archived_namespace = archived.metadata.namespace.clone().unwrap_or_default();
        if archived_namespace != self.namespace {
            info!(
                uid = self.uid,
                archived = archived_namespace,
                requested = self.namespace,
                "an archived retry asked in another namespace than the workflow's"
            );
            return Err(ArchivedError::OtherNamespace {
                uid: self.uid.to_owned(),
                requested: self.namespace.clone(),
            });
        }
        self.status.status.workflow_name = Some(archived.name().to_owned());
        Ok(archived)
    }

    /// Plans the retry of `archived` and takes its share of the bound on pods
    /// in deletion (see [`crate::retry::admission::Admission::plan_admitted`]).
    async fn plan(
        &mut self,
        archived: Workflow,
        stop: &CancellationToken,
    ) -> Result<(Plan, Admitted), ArchivedError> {
        self.archived = Some(archived);
        let ctx = self.status.ctx;
        let admitted = ctx.admission.plan_admitted(self, stop).await?;
        // A waiting message, if it was written, is over.
        self.status.status.message.clear();
        Ok(admitted)
    }

    /// Deletes the plan's pods of the archived workflow `name` (only those
    /// its UID owns) until a list shows them gone.
    async fn delete(
        &mut self,
        name: &str,
        planned: &Plan,
        stop: &CancellationToken,
    ) -> Result<(), ArchivedError> {
        let ctx = self.status.ctx;
        let step = ctx.metrics.step(RetryKind::Archived, Metered::Delete);
        let request = self.status.uid();
        let mut deletion = Deletion::new(
            &ctx.engine,
            RequestKey::retry(&self.namespace, &request, &workflowretry_token(&request)),
            &self.namespace,
            name,
            ctx.config.drive(),
        )
        .owned_by(self.uid);
        deletion.plan(planned.pods_to_delete.iter().cloned(), &planned.pod_nodes);
        self.status.status.pods_total = deletion.count().total as u64;
        if let Err(e) = deletion.run(&mut Progress(self.status), stop).await {
            deletion.stop(stop).await;
            return Err(e);
        }
        self.status.status.pods_deleted = deletion.count().deleted as u64;
        Step::Delete.took(self.status, step.done_confirmed(deletion.confirm_took()));
        Ok(())
    }

    /// Creates the reset workflow `name` once (see the module's rules) and
    /// returns its UID.
    async fn create(
        &mut self,
        name: &str,
        mut workflow: Workflow,
    ) -> Result<String, ArchivedError> {
        let namespace = self.namespace.clone();
        let ctx = self.status.ctx;
        let step = ctx.metrics.step(RetryKind::Archived, Metered::Create);
        // Argo dehydrates before it clears the UID: nodes offloaded now are
        // written under the archived workflow's UID, then copied to the new one.
        // Done before Committing, so that little but the create itself comes
        // between that status and the create's answer.
        if self.database.offloads() {
            ctx.dehydrate(self.database, &mut workflow).await?;
        }
        workflow.metadata.uid = None;
        workflow.metadata.resource_version = None;
        workflow
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CREATED_BY.into(), self.status.uid());
        workflow
            .metadata
            .finalizers
            .get_or_insert_default()
            .push(CREATING.into());
        // From this status on, the request never sends a create again.
        let before = self.status.status.phase;
        self.status.status.phase = Some(RetryPhase::Committing);
        if let Err(e) = write(self.status).await {
            self.status.status.phase = before;
            return Err(e);
        }
        let created = match self
            .workflows
            .create(&PostParams::default(), &workflow)
            .await
        {
            Ok(created) => created.metadata.uid.unwrap_or_default(),
            // The name is taken: nothing was created. By an earlier attempt of
            // ours the status would have said so; by someone else: Argo's refusal.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.status.status.phase = before;
                created_by_us(&self.workflows, name, &self.status.uid())
                    .await?
                    .ok_or(ArchivedError::ExistsLive {
                        name: name.to_owned(),
                    })?
            }
            Err(e) => {
                // Refused by the API server (4xx, throttling included), the create
                // was not stored: the request may create it when tried again.
                // Anything else (a timeout, a lost connection) may have created
                // it, and the request stays Committing.
                if api_code(&e).is_some_and(|code| (400..500).contains(&code)) {
                    self.status.status.phase = before;
                }
                return Err(api(format!("creating workflow {namespace}/{name}"))(e));
            }
        };
        self.settle(name, &created).await?;
        if let Some(version) = offload::offloaded_version(&workflow) {
            copy_offloaded(self.database, self.uid, &created, &namespace, version).await?;
        }
        Step::Create.took(self.status, step.done());
        Ok(created)
    }

    /// Names the created workflow and each step's time in the message.
    fn finish(&mut self, name: &str, created: String) {
        let timings = self.status.status.timings.unwrap_or_default();
        let seconds = |s: Option<f64>| s.unwrap_or_default();
        info!(
            workflowretry = self.status.name(),
            workflow = name,
            archived_uid = self.uid,
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            "archived workflow retried"
        );
        self.status.status.workflow_uid = Some(created);
        self.status.status.message = format!(
            "created workflow {name} after deleting {} leftover pods (read {:.1}s, plan {:.1}s, delete {:.1}s, create {:.1}s){}",
            self.status.status.pods_deleted,
            seconds(timings.read_seconds),
            seconds(timings.plan_seconds),
            seconds(timings.delete_seconds),
            seconds(timings.create_seconds),
            self.unreleased.as_deref().unwrap_or_default(),
        );
    }

    /// Records the UID of workflow `name` it created, then removes
    /// [`CREATING`] from it: in that order, so that a request whose status
    /// does not name the UID never lost a workflow it created.
    async fn settle(&mut self, name: &str, created: &str) -> Result<(), ArchivedError> {
        self.status.status.workflow_uid = Some(created.to_owned());
        let recorded = report::record(
            self.status,
            RetryPhase::Committing,
            &format!("created workflow {name} (UID {created})"),
        )
        .await;
        if let Err(source) = recorded {
            // The WorkflowRetry is gone: no one resumes it, so none creates again.
            if api_code(&source) == Some(404) {
                self.release(name, created).await?;
            }
            return Err(ArchivedError::Record {
                name: name.to_owned(),
                uid: created.to_owned(),
                source,
            });
        }
        match self.release(name, created).await {
            // The workflow is created and recorded: the request succeeded,
            // and says what is left to do by hand. (Failed, its TTL would
            // later delete the one object that could release it.)
            Err(e) if !e.is_transient() => {
                warn!(workflowretry = self.status.name(), workflow = name, error = %e, "the created workflow keeps its finalizer");
                self.unreleased = Some(format!(
                    "; it keeps finalizer {CREATING}, which rewind could not remove ({e}): remove it with `kubectl edit workflow -n {} {name}` once rewind's permissions are mended, or the workflow cannot be deleted",
                    self.namespace
                ));
                Ok(())
            }
            released => released,
        }
    }

    /// Removes [`CREATING`] from workflow `name` if it is still workflow
    /// `uid`, reading it again when others changed its finalizers meanwhile.
    async fn release(&self, name: &str, uid: &str) -> Result<(), ArchivedError> {
        let what = || {
            format!(
                "removing finalizer {CREATING} from workflow {}/{name}",
                self.namespace
            )
        };
        let mut attempt = 1;
        loop {
            let Some(live) = self
                .workflows
                .get_metadata_opt(name)
                .await
                .map_err(api(what()))?
            else {
                return Ok(());
            };
            let held = live.finalizers().iter().position(|f| f == CREATING);
            let Some(index) = held.filter(|_| live.uid().as_deref() == Some(uid)) else {
                return Ok(());
            };
            let patch = without_finalizer(uid, index, CREATING);
            let sent = self
                .workflows
                .patch_metadata(name, &PatchParams::default(), &patch)
                .await;
            match sent.as_ref().map_err(api_code) {
                Ok(_) | Err(Some(404)) => return Ok(()),
                // A `test` failed: the finalizers changed since the read.
                Err(Some(422)) if attempt < RELEASE_ATTEMPTS => attempt += 1,
                Err(Some(422)) => {
                    return Err(ArchivedError::FinalizersChanging {
                        name: name.to_owned(),
                    });
                }
                Err(_) => return sent.map(drop).map_err(api(what())),
            }
        }
    }

    /// Ends a request that may have created workflow `name` without creating
    /// it twice: done if the workflow it created is there (after the copy of
    /// its offloaded nodes, which may not have happened); Succeeded saying so if
    /// its status names the created workflow, now gone. Otherwise the workflow
    /// was never created: [`CREATING`] keeps a created one until its UID is
    /// recorded.
    async fn resume(&mut self, name: &str) -> Result<Resumed, ArchivedError> {
        let live = self
            .workflows
            .get_metadata_opt(name)
            .await
            .map_err(api(format!("reading workflow {name}")))?;
        let request = self.status.uid();
        let other = match live {
            Some(w) if w.annotations().get(CREATED_BY) == Some(&request) => {
                let done = w.uid().unwrap_or_default();
                self.found(name, done).await?;
                return Ok(Resumed::Ended);
            }
            Some(w) => Some(w.uid().unwrap_or_default()),
            None => None,
        };
        let Some(created) = self.status.status.workflow_uid.clone() else {
            info!(
                workflowretry = self.status.name(),
                workflow = name,
                "the workflow this request was creating was never created; going on to create it"
            );
            return Ok(Resumed::NotCreated);
        };
        info!(
            workflowretry = self.status.name(),
            workflow = name,
            created_uid = created,
            "the workflow this request created is gone; not creating it again"
        );
        self.status.status.message = format!(
            "created workflow {name} (UID {created}), which is no longer in the cluster (deleted since, by its TTL say){}",
            match other {
                Some(now) => format!("; the workflow {name} there now (UID {now}) is another one"),
                None => String::new(),
            }
        );
        Ok(Resumed::Ended)
    }

    /// Ends a request whose workflow `name` (UID `done`) is found created:
    /// settles it, copies its offloaded nodes (the copy after the create may
    /// not have happened) and names it.
    async fn found(&mut self, name: &str, done: String) -> Result<(), ArchivedError> {
        self.settle(name, &done).await?;
        let namespace = &self.namespace;
        let created = self
            .workflows
            .get_opt(name)
            .await
            .map_err(api(format!("reading workflow {namespace}/{name}")))?
            .filter(|w| w.metadata.uid.as_deref() == Some(done.as_str()));
        if let Some(version) = created.as_ref().and_then(offload::offloaded_version) {
            copy_offloaded(self.database, self.uid, &done, namespace, version).await?;
        }
        self.status.status.workflow_uid = Some(done);
        self.status.status.message = format!(
            "created workflow {name}{}",
            self.unreleased.as_deref().unwrap_or_default()
        );
        Ok(())
    }
}

impl Planning for Job<'_, '_> {
    type Planned = Plan;
    type Error = ArchivedError;

    /// Plans the workflow as first read; after a wait for room, reads it again.
    async fn read_and_plan(&mut self) -> Result<Plan, ArchivedError> {
        let archived = match self.archived.take() {
            Some(archived) => archived,
            None => read(self.database, self.uid).await?,
        };
        let ctx = self.status.ctx;
        let step = ctx.metrics.step(RetryKind::Archived, Metered::Plan);
        let options = ctx
            .config
            .plan_options(self.status.object.spec.options(), self.database.offloads());
        let planned = crate::retry::plan_off_thread(archived, options).await?;
        Step::Plan.took(self.status, step.done());
        Ok(planned)
    }

    fn pods(planned: &Plan) -> usize {
        planned.pods_to_delete.len()
    }

    async fn waiting(&mut self, message: &str) -> Result<(), ArchivedError> {
        self.status.status.phase = Some(RetryPhase::Pending);
        self.status.status.message = message.to_owned();
        write(self.status).await
    }
}

/// Archived workflow `uid` as Argo's archive has it.
async fn read(database: &dyn ArgoDatabase, uid: &str) -> Result<Workflow, ArchivedError> {
    database
        .archived_workflow(uid)
        .await
        .map_err(|source| ArchivedError::Read {
            uid: uid.to_owned(),
            source,
        })?
        .ok_or_else(|| ArchivedError::UnknownUid {
            uid: uid.to_owned(),
        })
}

/// The WorkflowRetry's status as the deletion's sink: the phase is written
/// before the first request (one bulk delete of thousands of pods reports
/// nothing else until it returns), progress at most every tick.
struct Progress<'r, 'a>(&'r mut ObjectStatus<'a>);

impl Progress<'_, '_> {
    async fn write(&mut self, count: &Count) -> Result<(), ArchivedError> {
        let status = &mut self.0.status;
        status.pods_total = count.total as u64;
        status.pods_deleted = count.shown() as u64;
        if let Some(note) = &count.note {
            status.message.clone_from(note);
        }
        write(self.0).await
    }
}

/// Writes the WorkflowRetry's status.
async fn write(status: &mut ObjectStatus<'_>) -> Result<(), ArchivedError> {
    let what = format!(
        "writing the status of WorkflowRetry {}/{}",
        status.namespace(),
        status.name()
    );
    status.write().await.map_err(api(what))
}

impl Sink for Progress<'_, '_> {
    type Error = ArchivedError;

    async fn deleting(&mut self, count: &Count) -> Result<(), ArchivedError> {
        self.0.status.phase = Some(RetryPhase::DeletingPods);
        self.write(count).await
    }

    async fn tick(&mut self, count: &Count) -> Result<(), ArchivedError> {
        self.write(count).await
    }

    fn shows_removals(&self) -> bool {
        true
    }
}

/// Copies the nodes offloaded under the archived workflow's UID to the
/// created one's, as Argo's server does after its create (idempotent).
async fn copy_offloaded(
    database: &dyn ArgoDatabase,
    from_uid: &str,
    to_uid: &str,
    namespace: &str,
    version: &str,
) -> Result<(), ArchivedError> {
    let copy = async {
        let nodes = database.offloaded_nodes(from_uid, version).await?;
        database.offload_nodes(to_uid, namespace, &nodes).await
    };
    copy.await.map_err(|source| ArchivedError::CopyOffloaded {
        uid: from_uid.to_owned(),
        source,
    })?;
    Ok(())
}

/// The workflow a request may have created already: its status says
/// Committing (the create may have been sent) or names the created UID.
fn creating(status: &ObjectStatus<'_>) -> Option<String> {
    let recorded = &status.status;
    let may_have =
        recorded.phase == Some(RetryPhase::Committing) || recorded.workflow_uid.is_some();
    recorded.workflow_name.clone().filter(|_| may_have)
}

/// The UID of live workflow `name` if this WorkflowRetry created it; an
/// error if another workflow of that name exists; `None` if none does.
async fn created_by_us(
    workflows: &Api<Workflow>,
    name: &str,
    request_uid: &str,
) -> Result<Option<String>, ArchivedError> {
    let found = workflows
        .get_metadata_opt(name)
        .await
        .map_err(api(format!("reading workflow {name}")))?;
    match found {
        None => Ok(None),
        Some(live)
            if live.annotations().get(CREATED_BY).map(String::as_str) == Some(request_uid) =>
        {
            Ok(Some(live.uid().unwrap_or_default()))
        }
        Some(_) => Err(ArchivedError::ExistsLive {
            name: name.to_owned(),
        }),
    }
}
