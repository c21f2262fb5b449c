//! Live progress handed from a live request to the WorkflowRetry that asked
//! for it, in process: the request's own report, the workflow's annotation,
//! is written rarely (each write rewrites the whole workflow), while the
//! WorkflowRetry's status is a small object that may follow each second of a
//! bulk delete.
//!
//! The request's end is handed over too, with whether it is being served at
//! all: the workflow's annotations tell only of its latest request, and a
//! later one overwrites them, so a WorkflowRetry that looked a moment late
//! would not know how its own request ended.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use tokio::sync::watch;

use crate::protocol::request::RetryStatus;

/// Plan pods, and how many are gone (confirmed or seen removed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub total: u64,
    pub deleted: u64,
}

/// How a request served in this process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// It was answered: its final report, as written on the workflow.
    Answered(RetryStatus),
    /// A newer request on the workflow replaced it before its reset.
    Replaced,
}

/// What a follower hears of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Heard {
    seen: Seen,
    end: Option<End>,
}

/// Where a followed request stands in this process, as [`Following::settled`]
/// tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// A task serves it now: its end will be heard.
    Serving,
    /// It ended here.
    Ended(End),
    /// No task serves it here, and no end was heard: it was never served
    /// here since the follower started.
    Unheard,
}

/// Ends remembered, the latest ones: a WorkflowRetry's server interrupted (its status write
/// failed) follows its request again moments later, and by then the request may have ended
/// unfollowed and a later request overwritten its report on the workflow. As many as the
/// Events' series.
const REMEMBERED_ENDS: usize = crate::retry::recorder::MAX_SERIES;

struct Requests {
    /// Followers by request token.
    followed: HashMap<String, watch::Sender<Heard>>,
    /// Tokens being served, and by how many tasks.
    serving: HashMap<String, usize>,
    /// The latest ends, by request token, followed or not.
    ended: LruCache<String, End>,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            followed: HashMap::new(),
            serving: HashMap::new(),
            ended: LruCache::new(NonZeroUsize::new(REMEMBERED_ENDS).expect("not zero")),
        }
    }
}

/// The requests followed by a WorkflowRetry's server, and those served, by
/// request token.
#[derive(Clone, Default)]
pub struct Board {
    requests: Arc<Mutex<Requests>>,
}

/// A WorkflowRetry's server following request `token`; the request is no
/// longer followed once this is dropped.
pub struct Following {
    board: Board,
    token: String,
    heard: watch::Receiver<Heard>,
}

/// A task serving request `token`: it publishes the request's end, if any,
/// before this is dropped.
pub struct Serving {
    board: Board,
    token: String,
}

impl Board {
    /// Follows request `token` (one follower per token: a later one
    /// replaces the earlier), with its end if it ended already.
    pub fn follow(&self, token: &str) -> Following {
        let mut requests = self.lock();
        let end = requests.ended.get(token).cloned();
        let (sender, heard) = watch::channel(Heard {
            end,
            ..Heard::default()
        });
        requests.followed.insert(token.to_owned(), sender);
        drop(requests);
        Following {
            board: self.clone(),
            token: token.to_owned(),
            heard,
        }
    }

    /// Publishes request `token`'s progress; false when nothing follows it.
    pub fn publish(&self, token: &str, seen: Seen) -> bool {
        match self.lock().followed.get(token) {
            Some(sender) => {
                sender.send_if_modified(|last| std::mem::replace(&mut last.seen, seen) != seen);
                true
            }
            None => false,
        }
    }

    /// Publishes how request `token` ended, to its follower if it has one,
    /// and to one that comes later.
    pub fn end(&self, token: &str, end: End) {
        let mut requests = self.lock();
        if let Some(sender) = requests.followed.get(token) {
            sender.send_modify(|last| last.end = Some(end.clone()));
        }
        requests.ended.put(token.to_owned(), end);
    }

    /// Marks request `token` served until the guard is dropped.
    pub fn serving(&self, token: &str) -> Serving {
        *self.lock().serving.entry(token.to_owned()).or_default() += 1;
        Serving {
            board: self.clone(),
            token: token.to_owned(),
        }
    }

    /// Whether a WorkflowRetry's server follows request `token`.
    pub fn is_followed(&self, token: &str) -> bool {
        self.lock().followed.contains_key(token)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Requests> {
        // The maps are whole after any panic (each operation is one call on them).
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Following {
    /// Waits for new progress or the end (forever once the request's
    /// publisher is gone).
    pub async fn changed(&mut self) {
        if self.heard.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The latest progress, if any was published.
    pub fn latest(&self) -> Option<Seen> {
        Some(self.heard.borrow().seen).filter(|s| *s != Seen::default())
    }

    /// How the request ended, if its end was heard.
    pub fn end(&self) -> Option<End> {
        self.heard.borrow().end.clone()
    }

    /// Whether the request is served here, ended, or neither. Both are read
    /// under one lock, and a request publishes its end before it stops being
    /// served: a request found not served has no end left to hear.
    pub fn settled(&self) -> Settled {
        let requests = self.board.lock();
        if requests.serving.contains_key(&self.token) {
            return Settled::Serving;
        }
        match self.heard.borrow().end.clone() {
            Some(end) => Settled::Ended(end),
            None => Settled::Unheard,
        }
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut requests = self.board.lock();
        // Only our own entry: a later follower of the token may have replaced it.
        if requests
            .followed
            .get(&self.token)
            .is_some_and(|s| s.subscribe().same_channel(&self.heard))
        {
            requests.followed.remove(&self.token);
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut requests = self.board.lock();
        if let Some(count) = requests.serving.get_mut(&self.token) {
            *count -= 1;
            if *count == 0 {
                requests.serving.remove(&self.token);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::request::RetryPhase;

    #[tokio::test]
    async fn progress_reaches_the_follower_of_its_token_only() {
        let board = Board::default();
        let seen = Seen {
            total: 10,
            deleted: 4,
        };
        assert!(!board.publish("t", seen), "nobody follows yet");
        let mut following = board.follow("t");
        assert!(board.is_followed("t") && !board.is_followed("other"));
        assert_eq!(following.latest(), None);
        assert!(board.publish("t", seen));
        following.changed().await;
        assert_eq!(following.latest(), Some(seen));
        assert!(!board.publish("other", seen));
        // A second follower of the token replaces the first; the first one's
        // end leaves the second in place.
        let second = board.follow("t");
        drop(following);
        assert!(board.publish("t", seen));
        drop(second);
        assert!(!board.publish("t", seen));
    }

    #[tokio::test]
    async fn an_end_published_while_served_is_heard_once_the_request_is_not_served() {
        let board = Board::default();
        let mut following = board.follow("t");
        assert_eq!(following.settled(), Settled::Unheard);
        let serving = board.serving("t");
        let also = board.serving("t");
        assert_eq!(following.settled(), Settled::Serving);
        let answered = RetryStatus {
            token: "t".into(),
            phase: RetryPhase::Succeeded,
            pods_total: 3,
            pods_deleted: 3,
            message: "reset".into(),
            started_at: None,
            finished_at: None,
        };
        board.end("t", End::Answered(answered.clone()));
        following.changed().await;
        assert_eq!(following.end(), Some(End::Answered(answered.clone())));
        // Still served until every task serving it is done.
        assert_eq!(following.settled(), Settled::Serving);
        drop(serving);
        assert_eq!(following.settled(), Settled::Serving);
        drop(also);
        assert_eq!(following.settled(), Settled::Ended(End::Answered(answered)));
        // Another token's end reaches no one here.
        board.end("other", End::Replaced);
        assert!(!board.is_followed("other"));
    }

    /// A WorkflowRetry's server interrupted (its status write failed) stops following its
    /// request; the request ends meanwhile, and a later request overwrites its report on the
    /// workflow. Following it again, the server hears the end (randomized trial 8 of seed
    /// 7120731: before, it ended Failed, "cannot tell whether it reset the workflow").
    #[tokio::test]
    async fn an_end_published_while_nobody_follows_is_heard_by_a_later_follower() {
        let board = Board::default();
        let interrupted = board.follow("t");
        drop(interrupted);
        let serving = board.serving("t");
        board.end("t", End::Replaced);
        drop(serving);
        let again = board.follow("t");
        assert_eq!(again.settled(), Settled::Ended(End::Replaced));
        assert_eq!(board.follow("other").settled(), Settled::Unheard);
    }
}
