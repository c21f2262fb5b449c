//! The cap on requests in flight, which shrinks when the server throttles and grows back.
//!
//! A priority level of API Priority and Fairness serves a few requests at once and rejects the
//! rest (429). Were every worker to resend together when the pause ends, the same few would
//! fit and the rest be rejected again, with a Retry-After the server doubles each time (up to
//! 32 s): measured on the real API server, 32 workers against a 3-seat level had not finished
//! a 150-pod retry after 4 minutes, Retry-After at 16 s (with this cap: 200 pods in 30-40 s,
//! Retry-After 1 to 4 s). So the cap is halved on a rejection (once per round of requests: the
//! rejections of requests sent under the old cap are one signal) and grows by one after a cap's
//! worth of successes, up to the configured number of workers (TCP's AIMD).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Slots beyond the cap for writes whose token is in hand (see [`Slots::acquire_now`]).
pub(super) const RESERVED: usize = 4;

/// Request slots, at most `max` and at least one, and [`RESERVED`] more for writes sent now.
#[derive(Debug)]
pub(super) struct Slots {
    semaphore: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    max: usize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Slots requests may hold now.
    limit: usize,
    /// Slots held by requests in flight.
    held: usize,
    /// Permits to retire as they come back (the cap shrank while they were held).
    debt: usize,
    /// Successes since the cap last grew.
    successes: usize,
    /// Counts the shrinks: a slot taken before the latest one gives no new signal.
    round: u64,
}

/// One request's slot; give it back with [`Slots::release`].
#[derive(Debug)]
pub(super) struct Slot {
    permit: OwnedSemaphorePermit,
    round: u64,
    /// Taken from the reserve: it neither shrinks nor grows the cap.
    reserved: bool,
}

impl Slots {
    pub(super) fn new(max: usize) -> Self {
        Slots {
            semaphore: Arc::new(Semaphore::new(max)),
            reserve: Arc::new(Semaphore::new(RESERVED)),
            max,
            state: Mutex::new(State {
                limit: max,
                held: 0,
                debt: 0,
                successes: 0,
                round: 0,
            }),
        }
    }

    pub(super) async fn acquire(&self) -> Slot {
        let permit = Arc::clone(&self.semaphore)
            .acquire_owned()
            .await
            .expect("the slots semaphore is never closed");
        self.held(permit, false)
    }

    /// A slot for a write whose token is in hand (a delete worker's, see
    /// `Budget::take_write_token`): from the cap if one is free, else from the reserve,
    /// whichever comes first. Such a write was chosen to go now, and a bulk delete's proof
    /// ages while it waits (`engine::workers::MAX_PROOF_AGE`): behind every queued read for
    /// a slot of the cap, under load, it expired before its send.
    pub(super) async fn acquire_now(&self) -> Slot {
        let (permit, reserved) = tokio::select! {
            biased;
            permit = Arc::clone(&self.semaphore).acquire_owned() => (permit, false),
            permit = Arc::clone(&self.reserve).acquire_owned() => (permit, true),
        };
        self.held(
            permit.expect("the slots semaphores are never closed"),
            reserved,
        )
    }

    fn held(&self, permit: OwnedSemaphorePermit, reserved: bool) -> Slot {
        let mut state = self.state();
        state.held += 1;
        Slot {
            permit,
            round: state.round,
            reserved,
        }
    }

    /// Gives `slot` back; `throttled` says whether its request was throttled (429 or 503 with
    /// Retry-After) and `succeeded` whether it got an answer that was not an error.
    pub(super) fn release(&self, slot: Slot, throttled: bool, succeeded: bool) {
        let mut state = self.state();
        state.held -= 1;
        if slot.reserved {
            return;
        }
        if throttled && slot.round == state.round {
            let shrunk = (state.limit / 2).max(1);
            let cut = state.limit - shrunk;
            state.limit = shrunk;
            state.round += 1;
            state.successes = 0;
            let forgotten = self.semaphore.forget_permits(cut);
            state.debt += cut - forgotten;
        } else if succeeded && slot.round == state.round && state.limit < self.max {
            state.successes += 1;
            if state.successes >= state.limit {
                state.successes = 0;
                state.limit += 1;
                if state.debt > 0 {
                    state.debt -= 1;
                } else {
                    self.semaphore.add_permits(1);
                }
            }
        }
        if state.debt > 0 {
            state.debt -= 1;
            slot.permit.forget();
        }
    }

    /// Requests holding a slot now.
    pub(super) fn in_use(&self) -> usize {
        self.state().held
    }

    /// The cap now.
    #[cfg(test)]
    pub(super) fn limit(&self) -> usize {
        self.state().limit
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_throttled_round_halves_the_cap_once() {
        let slots = Slots::new(32);
        let held: Vec<Slot> = futures::future::join_all((0..32).map(|_| slots.acquire())).await;
        assert_eq!(slots.in_use(), 32);
        // Every request of the round is rejected: one signal, one halving.
        for slot in held {
            slots.release(slot, true, false);
        }
        assert_eq!(slots.limit(), 16);
        assert_eq!(slots.in_use(), 0);
        assert_eq!(slots.semaphore.available_permits(), 16);
        // A request sent under the new cap and throttled halves it again.
        let slot = slots.acquire().await;
        slots.release(slot, true, false);
        assert_eq!(slots.limit(), 8);
        assert_eq!(slots.semaphore.available_permits(), 8);
    }

    #[tokio::test]
    async fn slots_held_when_the_cap_shrinks_are_retired_as_they_return() {
        let slots = Slots::new(8);
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(slots.acquire().await);
        }
        let first = held.pop().unwrap();
        slots.release(first, true, false);
        assert_eq!(slots.limit(), 4);
        // Seven still out, room for four: three are retired on return, then one comes back.
        for slot in held {
            slots.release(slot, false, true);
        }
        assert_eq!(slots.semaphore.available_permits(), 4);
        assert_eq!(slots.in_use(), 0);
    }

    #[tokio::test]
    async fn the_cap_grows_by_one_per_caps_worth_of_successes_up_to_max() {
        let slots = Slots::new(4);
        let slot = slots.acquire().await;
        slots.release(slot, true, false);
        let slot = slots.acquire().await;
        slots.release(slot, true, false);
        assert_eq!(slots.limit(), 1);
        let mut limits = Vec::new();
        for _ in 0..12 {
            let slot = slots.acquire().await;
            slots.release(slot, false, true);
            limits.push(slots.limit());
        }
        assert_eq!(limits, [2, 2, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4]);
        assert_eq!(slots.semaphore.available_permits(), 4);
        // Errors without an answer neither shrink nor grow it.
        let slot = slots.acquire().await;
        slots.release(slot, false, false);
        assert_eq!(slots.limit(), 4);
    }
}

#[cfg(test)]
mod reserve {
    use super::*;

    #[tokio::test]
    async fn a_write_sent_now_takes_a_reserved_slot_when_the_cap_is_full() {
        let slots = Slots::new(2);
        let held = [slots.acquire().await, slots.acquire().await];
        let now: Vec<Slot> =
            futures::future::join_all((0..RESERVED).map(|_| slots.acquire_now())).await;
        assert!(now.iter().all(|s| s.reserved));
        assert_eq!(slots.in_use(), 2 + RESERVED);
        for slot in now {
            // A reserved slot says nothing about the cap.
            slots.release(slot, true, false);
        }
        assert_eq!(slots.limit(), 2);
        for slot in held {
            slots.release(slot, false, true);
        }
        assert_eq!(slots.in_use(), 0);
    }
}
