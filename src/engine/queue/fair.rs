//! Round-robin between the lanes of one class (a lane is the requests of one
//! asker: a `rewind retry -l` of 200 workflows is one lane, a user's single
//! retry another).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// The ready items of one class, one FIFO lane per request, served one item per lane in turn so
/// that a 20-pod retry is not stuck behind a 10,000-pod one.
///
/// Items leave a lane lazily: the queue marks an item stale (its ticket no longer matches) instead
/// of searching the lane, and `pop` skips stale entries. `ready` counts only live entries.
#[derive(Debug)]
pub(super) struct Fair<K, R> {
    turns: VecDeque<R>,
    lanes: HashMap<R, Lane<K>>,
    ready: usize,
}

#[derive(Debug)]
struct Lane<K> {
    items: VecDeque<(K, u64)>,
    ready: usize,
}

impl<K, R: Clone + Eq + Hash> Fair<K, R> {
    pub(super) fn new() -> Self {
        Fair {
            turns: VecDeque::new(),
            lanes: HashMap::new(),
            ready: 0,
        }
    }

    /// Live items of this class.
    pub(super) fn ready(&self) -> usize {
        self.ready
    }

    pub(super) fn push(&mut self, request: &R, item: K, ticket: u64) {
        let lane = self.lanes.entry(request.clone()).or_insert_with(|| {
            self.turns.push_back(request.clone());
            Lane {
                items: VecDeque::new(),
                ready: 0,
            }
        });
        lane.items.push_back((item, ticket));
        lane.ready += 1;
        self.ready += 1;
    }

    /// Marks `n` live items of `lane` stale: the caller changed their tickets
    /// or dropped them, and `pop` skips them when it meets them.
    pub(super) fn unready(&mut self, lane: &R, n: usize) {
        if let Some(lane) = self.lanes.get_mut(lane) {
            let n = n.min(lane.ready);
            lane.ready -= n;
            self.ready -= n;
        }
    }

    /// The next live item, taking one from the lane whose turn it is; `live` tells whether a
    /// ticket is still current.
    pub(super) fn pop(&mut self, mut live: impl FnMut(&K, u64) -> bool) -> Option<(R, K)> {
        while let Some(request) = self.turns.pop_front() {
            let Some(lane) = self.lanes.get_mut(&request) else {
                continue;
            };
            let found = loop {
                match lane.items.pop_front() {
                    Some((item, ticket)) if live(&item, ticket) => break Some(item),
                    Some(_) => continue,
                    None => break None,
                }
            };
            if let Some(item) = found {
                lane.ready -= 1;
                self.ready -= 1;
                if lane.items.is_empty() {
                    self.lanes.remove(&request);
                } else {
                    self.turns.push_back(request.clone());
                }
                return Some((request, item));
            }
            self.lanes.remove(&request);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(fair: &mut Fair<u32, &'static str>) -> Vec<(&'static str, u32)> {
        std::iter::from_fn(|| fair.pop(|_, _| true)).collect()
    }

    #[test]
    fn lanes_take_turns() {
        let mut fair = Fair::new();
        for i in 0..4 {
            fair.push(&"big", 100 + i, 0);
        }
        fair.push(&"small", 1, 0);
        fair.push(&"small", 2, 0);
        assert_eq!(fair.ready(), 6);
        assert_eq!(
            drain(&mut fair),
            [
                ("big", 100),
                ("small", 1),
                ("big", 101),
                ("small", 2),
                ("big", 102),
                ("big", 103)
            ]
        );
        assert_eq!(fair.ready(), 0);
    }

    #[test]
    fn stale_items_are_skipped() {
        let mut fair = Fair::new();
        fair.push(&"a", 1, 0);
        fair.push(&"a", 2, 0);
        fair.push(&"b", 3, 0);
        fair.push(&"c", 4, 0);
        fair.unready(&"a", 1);
        fair.unready(&"c", 5);
        assert_eq!(fair.ready(), 2);
        assert_eq!(fair.pop(|item, _| *item != 1), Some(("a", 2)));
        assert_eq!(fair.pop(|item, _| *item != 4), Some(("b", 3)));
        assert_eq!(fair.pop(|_, _| false), None);
        assert_eq!(fair.ready(), 0);
    }
}
