//! The node graph of a workflow and the walks of Argo's retry
//! (`newWorkflowsDag`, `dagSortedNodes`, `resetPath` and helpers in
//! `workflow/util/util.go`).
//!
//! Argo's walks have no guard against cycles in `children` or in the parent
//! chain and loop forever on them; these report [`PlanError::ArgoLoops`]
//! where Argo would not terminate. Nodes are indexed in node-ID order, the
//! order Argo v4 builds the parent map in.

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use crate::argo::plan::compress::Nodes;
use crate::argo::plan::{ChooseParent, PlanError};
use crate::argo::workflow::NodeStatus;

pub(crate) mod node_type {
    pub const POD: &str = "Pod";
    pub const CONTAINER: &str = "Container";
    pub const STEPS: &str = "Steps";
    pub const STEP_GROUP: &str = "StepGroup";
    pub const DAG: &str = "DAG";
    pub const TASK_GROUP: &str = "TaskGroup";
    pub const RETRY: &str = "Retry";
    pub const SUSPEND: &str = "Suspend";
    pub const HTTP: &str = "HTTP";
    pub const PLUGIN: &str = "Plugin";
}

pub(crate) fn is_group(type_: &str) -> bool {
    matches!(
        type_,
        node_type::DAG | node_type::TASK_GROUP | node_type::STEP_GROUP | node_type::STEPS
    )
}

pub(crate) fn is_execution(type_: &str) -> bool {
    matches!(
        type_,
        node_type::CONTAINER | node_type::POD | node_type::HTTP | node_type::PLUGIN
    )
}

pub(crate) fn failed_or_error(node: &NodeStatus) -> bool {
    matches!(node.phase(), "Failed" | "Error")
}

/// `newWorkflowsDag`: every node with its one recorded parent and its
/// children.
pub(crate) struct Graph<'a> {
    pub nodes: Vec<&'a NodeStatus>,
    pub index: HashMap<&'a str, usize>,
    pub parent: Vec<Option<usize>>,
    pub children: Vec<Vec<usize>>,
    /// Whether a cycle is reachable from the node, which makes Argo's
    /// unguarded walks below it loop forever.
    reaches_cycle: Vec<bool>,
}

impl<'a> Graph<'a> {
    /// A node listed as a child by several nodes (a DAG task with several
    /// dependencies) gets the parent `choose` picks from the listing nodes'
    /// IDs, in ID order (see [`crate::argo::plan::ChooseParent`]). Of several
    /// faults, Argo reports whichever its random map order meets first; the
    /// planner reports the first in node-ID order.
    pub fn build(
        nodes: &'a Nodes,
        workflow_name: &str,
        choose: ChooseParent<'_>,
    ) -> Result<Self, PlanError> {
        let list: Vec<&NodeStatus> = nodes.values().map(|n| &**n).collect();
        let n = list.len();
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(n);
        for (i, node) in list.iter().enumerate() {
            index.insert(node.id.as_str(), i);
        }
        let resolved: Vec<Vec<Option<usize>>> = list
            .iter()
            .map(|node| {
                node.children()
                    .iter()
                    .map(|c| index.get(c.as_str()).copied())
                    .collect()
            })
            .collect();
        // The listing nodes of each node, in ID order: the first, and all of
        // them only for the few nodes listed several times.
        let mut first_lister: Vec<Option<usize>> = vec![None; n];
        let mut listers: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, kids) in resolved.iter().enumerate() {
            for &c in kids.iter().flatten() {
                match first_lister[c] {
                    None => first_lister[c] = Some(i),
                    Some(f) if f == i => {}
                    Some(f) => {
                        let l = listers.entry(c).or_insert_with(|| vec![f]);
                        if l.last() != Some(&i) {
                            l.push(i);
                        }
                    }
                }
            }
        }
        let on_exit = format!("{workflow_name}.onExit");
        let mut parent = vec![None; n];
        let mut children = Vec::with_capacity(n);
        for (i, (node, kids)) in list.iter().zip(resolved).enumerate() {
            let p = match listers.get(&i) {
                Some(l) => {
                    let ids: Vec<&str> = l.iter().map(|&j| list[j].id.as_str()).collect();
                    Some(l[choose(&node.id, &ids).min(l.len() - 1)])
                }
                None => first_lister[i],
            };
            if p.is_none() && node.name != workflow_name && !node.name.starts_with(&on_exit) {
                return Err(PlanError::MissingParent {
                    node: node.id.to_string(),
                });
            }
            parent[i] = p;
            if let Some(missing) = kids.iter().position(Option::is_none) {
                return Err(PlanError::MissingChild {
                    child: node.children()[missing].to_string(),
                });
            }
            children.push(kids.into_iter().flatten().collect());
        }
        let reaches_cycle = reaches_cycle(&children);
        Ok(Self {
            nodes: list,
            index,
            parent,
            children,
            reaches_cycle,
        })
    }

    fn id(&self, i: usize) -> &str {
        &self.nodes[i].id
    }

    fn type_(&self, i: usize) -> &str {
        &self.nodes[i].type_
    }

    /// `getChildren`: every node below `i` (including `i` itself only through
    /// a cycle, which Argo never leaves).
    pub fn descendants(&self, i: usize, mut f: impl FnMut(usize)) -> Result<(), PlanError> {
        if self.reaches_cycle[i] {
            return Err(self.loops(i, "the nodes below it form a cycle"));
        }
        // Without cycles, revisits come only from shared children; skip their
        // repeated subtrees (Argo walks them again to no effect).
        let mut seen = HashSet::new();
        let mut queue = VecDeque::from([i]);
        while let Some(curr) = queue.pop_front() {
            for &c in &self.children[curr] {
                if seen.insert(c) {
                    f(c);
                    queue.push_back(c);
                }
            }
        }
        Ok(())
    }

    /// `dagSortedNodes`: breadth-first from the root, each node once. v3.7
    /// keeps no visited set, which changes nothing but termination: it loops
    /// forever when a cycle is reachable (`unguarded`).
    pub fn bfs_order(&self, root: usize, unguarded: bool) -> Result<Vec<usize>, PlanError> {
        if unguarded && self.reaches_cycle[root] {
            return Err(self.loops(root, "the nodes below the root form a cycle"));
        }
        let mut visited = vec![false; self.nodes.len()];
        visited[root] = true;
        let mut order = Vec::with_capacity(self.nodes.len());
        order.push(root);
        let mut head = 0;
        while head < order.len() {
            let curr = order[head];
            head += 1;
            for &c in &self.children[curr] {
                if !std::mem::replace(&mut visited[c], true) {
                    order.push(c);
                }
            }
        }
        Ok(order)
    }

    /// `resetPath` of one start node: adds to `reset` the nodes Argo resets on
    /// the way up and to `delete` the start node, everything below it and the
    /// pods of containers on the way. `root` is `singularPath`'s root.
    pub fn reset_path(
        &self,
        root: usize,
        start: usize,
        reset: &mut [bool],
        delete: &mut [bool],
    ) -> Result<(), PlanError> {
        // singularPath: its errors make Argo index an empty slice.
        let mut curr = start;
        let mut steps = 0;
        while self.id(curr) != self.id(root) {
            curr = self.parent[curr].ok_or_else(|| PlanError::ArgoPanics {
                reason: format!(
                    "runtime error: index out of range [-1] (the parents of node {} do not lead to the root node {})",
                    self.id(start),
                    self.id(root)
                ),
            })?;
            steps += 1;
            if steps > self.nodes.len() {
                return Err(self.loops(start, "its parents form a cycle"));
            }
        }
        delete[start] = true;
        self.descendants(start, |d| delete[d] = true)?;
        if steps == 0 {
            return Ok(());
        }

        let mut curr = Some(start);
        while let Some(c) = curr {
            let t = self.type_(c);
            if is_group(t) {
                reset[c] = true;
                curr = self.reset_boundaries(c, reset)?;
                continue;
            }
            if t == node_type::RETRY && failed_or_error(self.nodes[c]) {
                reset[c] = true;
            } else if t == node_type::CONTAINER {
                let pod = self.reset_until(c, reset, |n| n.type_ == node_type::POD)?;
                delete[pod] = true;
                self.descendants(pod, |d| delete[d] = true)?;
                curr = Some(pod);
                continue;
            }
            curr = self.parent[c];
        }
        Ok(())
    }

    /// `resetBoundaries`: climbs from a group node through Retry parents and
    /// boundaries, resetting them, and returns where `resetPath` goes on.
    fn reset_boundaries(&self, n: usize, reset: &mut [bool]) -> Result<Option<usize>, PlanError> {
        let mut curr = n;
        let mut previous = None;
        loop {
            // Each round depends only on `curr`: meeting it again is Argo's endless loop.
            if previous == Some(curr) {
                return Err(self.loops(curr, "its boundaryID is its own ID"));
            }
            previous = Some(curr);
            if let Some(p) = self.parent[curr].filter(|&p| self.type_(p) == node_type::RETRY) {
                reset[p] = true;
                curr = p;
            }
            if let Some(p) = self.parent[curr]
                .filter(|&p| matches!(self.type_(p), node_type::STEP_GROUP | node_type::TASK_GROUP))
            {
                reset[p] = true;
            }
            let boundary = self.nodes[curr].boundary_id.as_deref().unwrap_or_default();
            if boundary.is_empty() {
                return Ok(self.parent[curr]);
            }
            curr = self.reset_until(curr, reset, |n| n.id == boundary)?;
        }
    }

    /// `resetUntil`: the first node from `n` upwards that matches, reset.
    fn reset_until(
        &self,
        n: usize,
        reset: &mut [bool],
        matches: impl Fn(&NodeStatus) -> bool,
    ) -> Result<usize, PlanError> {
        let mut curr = Some(n);
        while let Some(c) = curr {
            if matches(self.nodes[c]) {
                reset[c] = true;
                return Ok(c);
            }
            curr = self.parent[c];
        }
        Err(PlanError::NoAncestor {
            node: self.id(n).to_owned(),
        })
    }

    fn loops(&self, i: usize, why: &str) -> PlanError {
        PlanError::ArgoLoops {
            reason: format!("at node {}: {why}", self.id(i)),
        }
    }
}

/// For each node, whether a cycle is reachable from it (iterative DFS).
fn reaches_cycle(children: &[Vec<usize>]) -> Vec<bool> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        New,
        Open,
        Done,
    }
    let mut state = vec![State::New; children.len()];
    let mut reaches = vec![false; children.len()];
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for start in 0..children.len() {
        if state[start] != State::New {
            continue;
        }
        state[start] = State::Open;
        stack.push((start, 0));
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&child) = children[node].get(*next) {
                *next += 1;
                match state[child] {
                    State::New => {
                        state[child] = State::Open;
                        stack.push((child, 0));
                    }
                    State::Open => reaches[node] = true,
                    State::Done => reaches[node] |= reaches[child],
                }
            } else {
                state[node] = State::Done;
                stack.pop();
                if let Some(&(parent, _)) = stack.last() {
                    reaches[parent] |= reaches[node];
                }
            }
        }
    }
    reaches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycle_reachability() {
        // 0 -> 1 -> 2 -> 1, 3 -> 4, 5 -> 5
        let children = vec![vec![1], vec![2], vec![1], vec![4], vec![], vec![5]];
        assert_eq!(
            reaches_cycle(&children),
            vec![true, true, true, false, false, true]
        );
        // A diamond is no cycle.
        let diamond = vec![vec![1, 2], vec![3], vec![3], vec![]];
        assert_eq!(reaches_cycle(&diamond), vec![false; 4]);
    }
}
