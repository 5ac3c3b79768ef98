//! The `tracing` feature's events (issue 51), recorded by a subscriber of the test's own: a
//! grant and its reason (new, refresh, takeover of a dead holder, an expired one), a refusal,
//! a renew, a renew lost, a release, and the keep-alive's loss as a warning. On the in-memory
//! backend with a manual clock: every event comes from the front all backends share.

#![cfg(feature = "tracing")]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flocklease::conformance::START;
use flocklease::{KeepAlive, ManualClock, MemLease, MemStore, Owner, SessionId};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// One recorded event: its level and fields (`message` included), as text.
#[derive(Clone, Debug)]
struct Seen {
    level: Level,
    fields: BTreeMap<String, String>,
}

impl Seen {
    fn get(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }
}

/// Records every event of target `flocklease`.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "flocklease" {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Seen {
            level: *event.metadata().level(),
            fields,
        });
    }
}

impl Recorder {
    /// The events recorded since the last call.
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    /// The one event recorded since the last call.
    fn one(&self) -> Seen {
        let seen = self.take();
        assert_eq!(seen.len(), 1, "{seen:#?}");
        seen.into_iter().next().unwrap()
    }
}

fn owner(s: &str) -> Owner {
    Owner::new(s).unwrap()
}

#[test]
fn every_decision_that_matters_is_an_event_with_id_token_and_reason() {
    let recorder = Recorder::default();
    // Global: the keep-alive's watcher thread emits too.
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(recorder.clone()))
        .unwrap();
    let store = MemStore::new();
    let clock = ManualClock::new(START);
    let ttl = Duration::from_secs(30);
    let instance = || Arc::new(MemLease::new(store.clone(), Arc::new(clock.clone()), ttl));
    let (a, b) = (instance(), instance());
    let id = SessionId::new("jobs").unwrap();

    let first = a.acquire(&id, &owner("a")).unwrap().lease().unwrap();
    let e = recorder.one();
    assert_eq!(e.level, Level::INFO);
    assert_eq!(e.get("message"), "lease granted");
    assert_eq!(
        (e.get("id"), e.get("owner"), e.get("token"), e.get("reason")),
        ("jobs", "a", "1", "new")
    );
    assert!(e.fields.contains_key("expiry") && e.fields.contains_key("took_ms"));

    assert!(a.acquire(&id, &owner("a")).unwrap().lease().is_some());
    assert_eq!(recorder.one().get("reason"), "refresh");

    assert!(b.acquire(&id, &owner("b")).unwrap().is_held());
    let e = recorder.one();
    assert_eq!((e.level, e.get("message")), (Level::DEBUG, "lease held"));
    assert_eq!((e.get("holder"), e.get("holder_token")), ("a", "1"));

    assert!(a.renew(&first).unwrap().lease().is_some());
    let e = recorder.one();
    assert_eq!((e.level, e.get("message")), (Level::DEBUG, "lease renewed"));

    // The holder's instance crashes: the next acquire takes over a dead holder.
    drop(a);
    let second = b.acquire(&id, &owner("b")).unwrap().lease().unwrap();
    let e = recorder.one();
    assert_eq!((e.get("token"), e.get("reason")), ("2", "takeover"));

    // Past its expiry, a third instance takes it from a live but expired holder; the old
    // holder's renew is then lost.
    let c = instance();
    clock.advance(ttl + Duration::from_secs(1));
    let third = c.acquire(&id, &owner("c")).unwrap().lease().unwrap();
    assert_eq!(recorder.one().get("reason"), "expired");
    assert!(b.renew(&second).unwrap().is_held());
    let e = recorder.one();
    assert_eq!(e.level, Level::WARN);
    assert!(e.get("message").starts_with("renew lost"), "{e:?}");
    assert_eq!((e.get("owner"), e.get("token")), ("b", "2"));

    c.release(&third).unwrap();
    let e = recorder.one();
    assert_eq!((e.level, e.get("message")), (Level::INFO, "lease released"));
    assert_eq!(e.get("token"), "3");

    // A keep-alive whose lease expires under it (the manual clock jumps; it looks every
    // 10 ms): its loss is a warning.
    let fourth = c.acquire(&id, &owner("c")).unwrap().lease().unwrap();
    recorder.take();
    let keep = KeepAlive::builder(Arc::clone(&c), fourth)
        .interval(Duration::from_secs(10))
        .clock_check(Duration::from_millis(10))
        .start()
        .unwrap();
    clock.advance(ttl + Duration::from_secs(1));
    assert!(keep.wait_lost(Some(Duration::from_secs(10))).is_some());
    // The loss is recorded before it is reported: the event follows within the bound.
    let by = std::time::Instant::now() + Duration::from_secs(10);
    let lost = loop {
        let seen = recorder.take();
        if let Some(e) = seen
            .into_iter()
            .find(|e| e.get("message") == "keep-alive lost the lease")
        {
            break e;
        }
        assert!(std::time::Instant::now() < by, "no keep-alive loss event");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(lost.level, Level::WARN);
    assert_eq!((lost.get("id"), lost.get("token")), ("jobs", "4"));
    assert!(lost.get("loss").contains("expired"), "{lost:?}");
}
