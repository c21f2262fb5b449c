//! Publishes Kubernetes Events (events.k8s.io/v1) about requests, repeats of one Event
//! folded into its series, with memory bounded however many objects the Events are about.
//!
//! Written here, not kube's `events::Recorder`: that one keeps every Event it published
//! (the whole object) for six minutes and walks them all at each publish. A busy cluster's
//! requests, each about its own object, made it the controller's largest allocation (a
//! hash table of 11.8 MiB after 6,000 requests, and growing with the request rate). Here,
//! as in client-go's event correlator, the series are remembered in a least-recently-used
//! cache of [`MAX_SERIES`] entries of a few hundred bytes each.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use lru::LruCache;

/// Series remembered at most: client-go's `maxLruCacheEntries`.
pub const MAX_SERIES: usize = 4096;

/// How long a repeat still joins its Event's series (kube's and client-go's six minutes).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// What makes a repeat of an Event: the same object, type, reason and action.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    regarding: (Option<String>, Option<String>, Option<String>),
    type_: &'static str,
    reason: String,
    action: String,
}

/// A published Event, as much as a repeat needs.
struct Series {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes Events as `reporter`; clones share the series.
#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    series: Arc<Mutex<LruCache<Key, Series>>>,
}

impl Recorder {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        let capacity = NonZeroUsize::new(MAX_SERIES).expect("MAX_SERIES is positive");
        Recorder {
            client,
            reporter,
            series: Arc::new(Mutex::new(LruCache::new(capacity))),
        }
    }

    /// Publishes `event` about `regarding`: a new Event, or, within six minutes of the last
    /// of the same object, type, reason and action, one more of that Event's series.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Key {
            regarding: (
                regarding.namespace.clone(),
                regarding.name.clone(),
                regarding.uid.clone(),
            ),
            type_: type_name(event.type_),
            reason: event.reason.clone(),
            action: event.action.clone(),
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let repeat = repeat_of(&mut self.lock(), &key, now);
        let series = match repeat {
            Some((name, count)) => {
                let patch = serde_json::json!({
                    "series": EventSeries { count, last_observed_time: MicroTime(now) },
                });
                events
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                Series {
                    name,
                    count,
                    last: now,
                }
            }
            None => {
                let created = events
                    .create(
                        &PostParams::default(),
                        &self.new_event(event, regarding, now),
                    )
                    .await?;
                Series {
                    name: created.metadata.name.unwrap_or_default(),
                    count: 1,
                    last: now,
                }
            }
        };
        self.lock().put(key, series);
        Ok(())
    }

    fn new_event(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                // Client-go's and kube's name: the object's, then the time in hex.
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(type_name(event.type_).into()),
            related: event.secondary.clone(),
            ..Default::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<Key, Series>> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The Event `key` repeats at `now`, and the series' count with this one; `None` for a new
/// Event.
fn repeat_of(
    series: &mut LruCache<Key, Series>,
    key: &Key,
    now: Timestamp,
) -> Option<(String, i32)> {
    series
        .get(key)
        .filter(|s| s.last + SERIES_WINDOW > now)
        .map(|s| (s.name.clone(), s.count + 1))
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(object: usize) -> Key {
        Key {
            regarding: (Some("ns".into()), Some(format!("wf-{object}")), None),
            type_: "Warning",
            reason: "RetryFailed".into(),
            action: "Retry".into(),
        }
    }

    #[test]
    fn a_repeat_within_six_minutes_joins_the_series_and_later_starts_anew() {
        let mut series = LruCache::new(NonZeroUsize::new(MAX_SERIES).unwrap());
        let t0 = Timestamp::UNIX_EPOCH + SignedDuration::from_hours(1);
        assert_eq!(repeat_of(&mut series, &key(1), t0), None);
        series.put(
            key(1),
            Series {
                name: "wf-1.a".into(),
                count: 3,
                last: t0,
            },
        );
        let soon = t0 + SignedDuration::from_mins(5);
        assert_eq!(
            repeat_of(&mut series, &key(1), soon),
            Some(("wf-1.a".into(), 4))
        );
        assert_eq!(
            repeat_of(&mut series, &key(2), soon),
            None,
            "another object's Event is new"
        );
        let late = t0 + SERIES_WINDOW;
        assert_eq!(repeat_of(&mut series, &key(1), late), None);
    }

    #[test]
    fn the_series_remembered_are_bounded_and_the_oldest_forgotten() {
        let mut series = LruCache::new(NonZeroUsize::new(MAX_SERIES).unwrap());
        let now = Timestamp::UNIX_EPOCH + SignedDuration::from_hours(1);
        for object in 0..=MAX_SERIES {
            series.put(
                key(object),
                Series {
                    name: format!("wf-{object}.a"),
                    count: 1,
                    last: now,
                },
            );
        }
        assert_eq!(series.len(), MAX_SERIES);
        assert_eq!(repeat_of(&mut series, &key(0), now), None);
        assert_eq!(
            repeat_of(&mut series, &key(MAX_SERIES), now).map(|r| r.1),
            Some(2)
        );
    }
}
