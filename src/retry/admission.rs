//! A bound on what runs at once, by weight: the planned pods of every retry
//! deleting at the same time. What a retry holds (its plan, the names and
//! UIDs of its pods) and the work it queues grow with its pods, so two large
//! retries must not run side by side past what the controller was sized for;
//! a retry over the bound waits (its status says so) rather than being
//! refused, and holds nothing while it waits.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::engine::drive::DeleteError;

/// Planned pods in deletion at once by default: what the chart's memory
/// limit leaves room for (docs/operating.md, "Memory sizing").
pub const DEFAULT_MAX_PODS: usize = 50_000;

/// The bound; clones share it.
#[derive(Clone, Debug)]
pub struct Admission {
    permits: Arc<Semaphore>,
    limit: usize,
}

/// A retry's share of the bound, given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Admission {
    /// At most `limit` planned pods (at least one) in deletion at once.
    pub fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Admission {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The weight of a retry of `pods`: a retry larger than the bound takes
    /// all of it (and runs alone) rather than waiting forever.
    fn weight(&self, pods: usize) -> u32 {
        // `limit` fits a semaphore, whose permits fit a u32.
        u32::try_from(pods.min(self.limit)).unwrap_or(u32::MAX)
    }

    /// Admits a retry of `pods` now, if the bound has room.
    pub fn try_admit(&self, pods: usize) -> Option<Admitted> {
        match self.weight(pods) {
            0 => Some(Admitted { _permit: None }),
            n => self
                .permits
                .clone()
                .try_acquire_many_owned(n)
                .ok()
                .map(|p| Admitted { _permit: Some(p) }),
        }
    }

    /// Waits until a retry of `pods` fits, first come first served.
    pub async fn admit(&self, pods: usize) -> Admitted {
        match self.weight(pods) {
            0 => Admitted { _permit: None },
            n => Admitted {
                _permit: Some(
                    self.permits
                        .clone()
                        .acquire_many_owned(n)
                        .await
                        .expect("the semaphore is never closed"),
                ),
            },
        }
    }

    /// Waits for room for a retry of `pods` that [`Admission::try_admit`]
    /// turned away; `None` if `stop` comes first. The retry waits holding
    /// nothing of its workflow (its plan dropped, its status saying why), and
    /// reads and plans it again once admitted: it may have changed meanwhile.
    pub async fn wait(&self, pods: usize, stop: &CancellationToken) -> Option<Admitted> {
        tokio::select! {
            _ = stop.cancelled() => None,
            admitted = self.admit(pods) => Some(admitted),
        }
    }

    /// Plans `retry` and takes the plan's share of the bound. When there is
    /// no room, the plan is dropped (a retry waits holding nothing of its
    /// workflow), its status says why, and once admitted it reads and plans
    /// again: the workflow may have changed meanwhile. That second plan runs
    /// whatever its size, as the wait was for the first.
    pub(crate) async fn plan_admitted<R: Planning>(
        &self,
        retry: &mut R,
        stop: &CancellationToken,
    ) -> Result<(R::Planned, Admitted), R::Error> {
        let planned = retry.read_and_plan().await?;
        let pods = R::pods(&planned);
        if let Some(admitted) = self.try_admit(pods) {
            return Ok((planned, admitted));
        }
        drop(planned);
        retry.waiting(&self.waiting_message(pods)).await?;
        let admitted = self.wait(pods, stop).await.ok_or(DeleteError::Stopped)?;
        Ok((retry.read_and_plan().await?, admitted))
    }

    /// Why a retry of `pods` waits: for its status.
    pub fn waiting_message(&self, pods: usize) -> String {
        format!(
            "waiting for room: retries are deleting {} of the {} planned pods rewind deletes at once (--max-pods-in-flight); this retry's {pods} pods start when enough of them are done",
            self.in_use(),
            self.limit
        )
    }

    /// Planned pods in deletion now.
    pub fn in_use(&self) -> usize {
        self.limit - self.permits.available_permits()
    }
}

/// A retry's own steps around [`Admission::plan_admitted`]: the live and the
/// archived flows read, plan and report each in their own way.
pub(crate) trait Planning {
    type Planned;
    type Error: From<DeleteError>;

    /// Reads the workflow and plans its retry.
    async fn read_and_plan(&mut self) -> Result<Self::Planned, Self::Error>;

    /// The pods the plan deletes: its weight in the bound.
    fn pods(planned: &Self::Planned) -> usize;

    /// Tells the user (the request's status) why the retry waits.
    async fn waiting(&mut self, message: &str) -> Result<(), Self::Error>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn retries_run_together_up_to_the_bound_then_wait_their_turn() {
        let admission = Admission::new(100);
        let first = admission.try_admit(60).expect("room for 60");
        assert!(admission.try_admit(50).is_none(), "60 + 50 is past 100");
        let small = admission.try_admit(40).expect("room for 40 more");
        assert_eq!(admission.in_use(), 100);
        // Nothing to delete waits for nothing.
        assert!(admission.try_admit(0).is_some());
        let waiting = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit(50).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first);
        let admitted = tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
            .await
            .expect("admitted once the first retry ended")
            .unwrap();
        drop((small, admitted));
        assert_eq!(admission.in_use(), 0);
        // A retry larger than the bound takes all of it.
        let huge = admission.try_admit(1_000).expect("alone, it runs");
        assert_eq!(admission.in_use(), 100);
        drop(huge);
    }

    /// A retry whose workflow grows by one pod at each read, and which
    /// records what its status was told.
    struct Growing {
        pods: usize,
        reads: usize,
        told: Vec<String>,
    }

    impl Planning for Growing {
        type Planned = usize;
        type Error = DeleteError;

        async fn read_and_plan(&mut self) -> Result<usize, DeleteError> {
            self.reads += 1;
            self.pods += 1;
            Ok(self.pods)
        }

        fn pods(planned: &usize) -> usize {
            *planned
        }

        async fn waiting(&mut self, message: &str) -> Result<(), DeleteError> {
            self.told.push(message.to_owned());
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_plan_without_room_says_why_waits_then_reads_and_plans_again() {
        let admission = Admission::new(10);
        let stop = CancellationToken::new();
        let mut retry = Growing {
            pods: 0,
            reads: 0,
            told: Vec::new(),
        };
        let (planned, first) = admission.plan_admitted(&mut retry, &stop).await.unwrap();
        assert_eq!((planned, retry.reads, retry.told.len()), (1, 1, 0));

        let full = admission.try_admit(9).expect("room for 9 more");
        let mut waiting = Growing {
            pods: 4,
            reads: 0,
            told: Vec::new(),
        };
        let admitted = {
            let admitted = admission.plan_admitted(&mut waiting, &stop);
            tokio::pin!(admitted);
            tokio::select! {
                _ = &mut admitted => panic!("admitted with no room"),
                _ = tokio::task::yield_now() => {}
            }
            drop(full);
            admitted.await.unwrap()
        };
        // Planned again after the wait: the workflow had grown meanwhile.
        assert_eq!((admitted.0, waiting.reads), (6, 2));
        assert_eq!(waiting.told.len(), 1);
        assert!(waiting.told[0].contains("5 pods"), "{:?}", waiting.told);

        // Stopped while waiting (7 of 10 in use): the request ends Stopped.
        stop.cancel();
        let mut stopped = Growing {
            pods: 20,
            reads: 0,
            told: Vec::new(),
        };
        let ended = admission.plan_admitted(&mut stopped, &stop).await;
        assert!(matches!(ended, Err(DeleteError::Stopped)), "{ended:?}");
        drop((first, admitted));
    }
}
