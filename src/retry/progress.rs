//! Live progress handed from a live request to the WorkflowRetry that asked
//! for it, in process: the request's own report, the workflow's annotation,
//! is written rarely (each write rewrites the whole workflow), while the
//! WorkflowRetry's status is a small object that may follow each second of a
//! bulk delete.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// Plan pods, and how many are gone (confirmed or seen removed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub total: u64,
    pub deleted: u64,
}

/// The requests followed by a WorkflowRetry's server, by request token.
#[derive(Clone, Default)]
pub struct Board {
    followed: Arc<Mutex<HashMap<String, watch::Sender<Seen>>>>,
}

/// A WorkflowRetry's server following request `token`; the request is no
/// longer followed once this is dropped.
pub struct Following {
    board: Board,
    token: String,
    seen: watch::Receiver<Seen>,
}

impl Board {
    /// Follows request `token` (one follower per token: a later one
    /// replaces the earlier).
    pub fn follow(&self, token: &str) -> Following {
        let (sender, seen) = watch::channel(Seen::default());
        self.lock().insert(token.to_owned(), sender);
        Following {
            board: self.clone(),
            token: token.to_owned(),
            seen,
        }
    }

    /// Publishes request `token`'s progress; false when nothing follows it.
    pub fn publish(&self, token: &str, seen: Seen) -> bool {
        match self.lock().get(token) {
            Some(sender) => {
                sender.send_if_modified(|last| std::mem::replace(last, seen) != seen);
                true
            }
            None => false,
        }
    }

    /// Whether a WorkflowRetry's server follows request `token`.
    pub fn is_followed(&self, token: &str) -> bool {
        self.lock().contains_key(token)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<Seen>>> {
        // The map is whole after any panic (each operation is one call on it).
        self.followed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Following {
    /// Waits for new progress (forever once the request's publisher is gone).
    pub async fn changed(&mut self) {
        if self.seen.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The latest progress, if any was published.
    pub fn latest(&self) -> Option<Seen> {
        Some(*self.seen.borrow()).filter(|s| *s != Seen::default())
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut followed = self.board.lock();
        // Only our own entry: a later follower of the token may have replaced it.
        if followed
            .get(&self.token)
            .is_some_and(|s| s.subscribe().same_channel(&self.seen))
        {
            followed.remove(&self.token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
