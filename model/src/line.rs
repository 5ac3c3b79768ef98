//! The line of waiting acquires (PROTOCOL §4.6) as a model: waiters in `<stem>.queue`, waiters
//! stopped in their place, a lock that is no waiter's place (of one byte, several, or to the end
//! of the file), a holder that lets the lease go, and the clock.
//!
//! | actor | steps |
//! | --- | --- |
//! | waiter | join: append a byte and lock it (a byte under another's lock: append again, three times, then wait unqueued) · look, once per tick (the real one looks every 200 µs, a tick is 10 ms): the adapter's look, [`flocklease::line::Place::may_try`] (whose turn, what a pass-over passes, whose grace is over) — on its turn and a free lease it is granted and leaves the line, its lock gone; not its turn and the lease free, it lets the lease go; a holder seen resets the count · stopped: keeps its place and does nothing |
//! | holder | the lease's holder lets it go (a release, an expiry, a crash: the lease is free); with a sibling, its release is two steps: the commit of the tombstone (the lease free; its instance's held flag set by [`flocklease::machine::held_until`]) and the generation's close (the flag down at the transition's end) |
//! | sibling | the last waiter, of the holder's own instance (another thread, another owner): its look is the adapter's — while the instance's held flag is up it tries at once, out of the line's order (a refresh for the same owner; held, for another), else the line decides |
//! | stray lock | taken before the waiters came, on any span of the file's first two bytes or from one of them to the end and beyond; never released |
//! | clock | moves one tick (10 ms) once every waiter that runs has looked |
//!
//! The kernel's `F_OFD_GETLK` is an oracle that reports, of the locks others hold on a range,
//! the one that starts **last** (the kernel promises only "one of them"; the rule must find the
//! earliest whichever it reports).
//!
//! The property: **a waiter on a free lease with no running waiter ahead is granted within
//! 50 ms + (K − 1) × 10 ms**, K the stopped places and stray locks ahead of it (PROTOCOL §4.6),
//! plus one tick (the model's waiter looks once per tick). Planting the old pass-over (the
//! first byte of a lock only: a lock of several bytes held everyone forever) or the whole
//! grace for every place ahead (K × 50 ms) breaks it; so does either mistake in
//! [`flocklease::line`] itself. And: **a waiter of the holder's instance skips the line only
//! while its instance holds the lease** — its look reads its instance's flag as holding only
//! then — but for the windows PROTOCOL §9.2 names, which the model leaves out (a takeover by
//! another process before the expiry, a commit whose transition then failed, another thread's
//! release committed between the adapter's look and its attempt). The held flag planted to go
//! down only at the transition's end rather than at the release's commit (as the flag that
//! followed the generation went down at its close, a cleanup after the liveness file's
//! deletion) breaks it. And the order itself: **no waiter in the line is granted while a
//! running waiter ahead of it waits** (the pass-over passes only places that do not look): a
//! grant with a running waiter ahead that the look did not pass over breaks it too (a look
//! that always lets its waiter try; one that forgets the file's first places, which a new
//! file's first waiters hold: without a stray lock the waiters' places start at byte 0).
//! Planting a pass-over of the lock the kernel reported rather than the earliest one ahead
//! breaks it, and only it: overtaking is fast, so the bound never sees it.

use std::fmt;
use std::time::Duration;

use flocklease::line::{self, Place, Span, Yielded};
use stateright::{Model, Property};

use crate::harness::SmallModel;

/// One tick of the model's clock.
pub const TICK: Duration = Duration::from_millis(10);

/// The bytes in the file before the waiters come (earlier waiters' places, long gone).
const EARLIER: i64 = 2;

/// A known mistake to plant, to see the checker catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinePlanted {
    /// The pass-over passes only the first byte of the lock ahead (the line before this
    /// round: a lock of several bytes held every waiter forever).
    PassOverFirstByte,
    /// Every place ahead gets the whole hand-off grace (K stopped waiters cost K × 50 ms).
    WholeGraceEach,
    /// The holder's instance's held flag goes down only at the transition's end, not at the
    /// release's commit (as the flag that followed the generation went down at its close: a
    /// waiter of the instance jumped the line between the release's commit and its close).
    HeldUntilClose,
    /// The pass-over passes the lock the kernel reported (`Place::ahead`: any one of the range,
    /// here the one that starts last) instead of the earliest: every place before it is passed
    /// with it, running waiters' too.
    PassOverReported,
}

/// The configuration.
#[derive(Clone, Debug)]
pub struct LineModel {
    /// How many waiters.
    pub waiters: usize,
    /// How many of them may be stopped.
    pub stops: u8,
    /// The clock runs from 0 to this many ticks.
    pub max_time: u8,
    /// The last waiter is of the holder's own instance.
    pub sibling: bool,
    /// A planted mistake.
    pub planted: Option<LinePlanted>,
}

impl Default for LineModel {
    fn default() -> Self {
        LineModel {
            waiters: 3,
            stops: 2,
            max_time: 12,
            sibling: true,
            planted: None,
        }
    }
}

/// Who holds the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Who {
    /// The holder the waiters wait for.
    Holder,
    /// A waiter, granted.
    Waiter(usize),
}

/// One waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Waiter {
    /// Its place (`None`: the line could not be used, the wait is unqueued).
    pub place: Option<Place>,
    /// How long it has let a free lease go.
    pub yielded: Yielded,
    /// Stopped: keeps its place, does nothing.
    pub stopped: bool,
    /// Its call returned (granted): its place is gone.
    pub gone: bool,
    /// It looked since the last tick.
    pub looked: bool,
    /// Of the holder's own instance.
    pub sibling: bool,
    /// Ghost (the model's own reading, for [`IN_ORDER`]): the tick at which it first let a
    /// free lease go since the last grant or live holder it saw.
    pub free_from: Option<u8>,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LineState {
    /// The clock, in ticks.
    pub now: u8,
    /// Who holds the lease (`None`: free).
    pub holder: Option<Who>,
    /// The record's token: one more with each grant.
    pub token: u64,
    /// A lock on the file that is no waiter's place.
    pub stray: Option<Span>,
    /// The waiters.
    pub waiters: Vec<Waiter>,
    /// Stops left.
    pub stops_left: u8,
    /// Ghost: since when the lease has been free with no grant (`None`: held).
    pub free_since: Option<u8>,
    /// Ghost: a waiter was granted past a stopped waiter's place.
    pub past_stopped: bool,
    /// Ghost: a waiter was granted past a stray lock of more than one byte.
    pub past_span: bool,
    /// The holder's instance's held flag (`flock::tx::held_at`): until when the instance holds the id
    /// (`None`: it does not).
    pub held: Option<flocklease::Timestamp>,
    /// The holder's release committed, its transition not ended yet.
    pub closing: bool,
    /// Ghost: the sibling's look read its instance's flag as holding while the instance did
    /// not hold the lease.
    pub skipped: bool,
    /// Ghost: the sibling looked between its instance's release's commit and its end.
    pub own_look: bool,
    /// Ghost: a waiter in the line passed over a running waiter that had not let the lease go
    /// for the hand-off grace.
    pub overtook: bool,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LineAction {
    /// The clock moves on one tick.
    Tick,
    /// The holder (the first, or a granted waiter) lets the lease go.
    Release,
    /// A waiter looks.
    Look(usize),
    /// A waiter is stopped.
    Stop(usize),
    /// The holder's released generation is closed: its transition ends.
    Close,
}

/// The property's name.
pub const WITHIN_BOUND: &str = "a waiter on a free lease with no running waiter ahead is granted within 50 ms + (K - 1) x 10 ms of K stopped places ahead";
/// Reachability: a grant past a stopped waiter.
pub const PAST_STOPPED: &str = "a waiter is granted past a stopped waiter's place";
/// Reachability: a grant past a lock of several bytes.
pub const PAST_SPAN: &str = "a waiter is granted past a lock of several bytes";
/// The property of the holder's instance's waiter.
pub const OWN_ORDER: &str =
    "a waiter of the holder's instance skips the line only while its instance holds the lease";
/// The line's order (PROTOCOL §4.6): the pass-over passes only places that do not look (a
/// stopped waiter, a stray lock); a running waiter is never passed. An unqueued waiter (no
/// place) and the holder's instance's waiter while its instance holds the lease ([`OWN_ORDER`])
/// are outside the line, as documented.
pub const IN_ORDER: &str = "no waiter in the line is granted ahead of a running waiter, nor passes over one that has not let the lease go for the hand-off grace";
/// Reachability: the sibling looks while its instance's release is under way.
pub const OWN_LOOK: &str =
    "a waiter of the holder's instance looks between its instance's release's commit and end";

/// The model's tick `now` as a timestamp (tick 0 at the Unix epoch).
fn at(now: u8) -> flocklease::Timestamp {
    flocklease::Timestamp::from_unix_nanos((TICK * u32::from(now)).as_nanos() as i128)
        .expect("a tick is a timestamp")
}

/// The holder's record's expiry: beyond the model's clock (its release, an expiry or a crash
/// ends its hold, as a step).
const HOLDER_EXPIRY: u8 = u8::MAX;

fn covers((start, len): Span, at: i64) -> bool {
    start <= at && (len == 0 || at < start + len)
}

fn overlaps((start, len): Span, from: i64, n: i64) -> bool {
    let end = if n == 0 { i64::MAX } else { from + n };
    let lock_end = if len == 0 { i64::MAX } else { start + len };
    start < end && from < lock_end
}

impl LineModel {
    /// The locks others than waiter `w` hold on the file.
    fn locks(s: &LineState, w: usize) -> Vec<Span> {
        let mut locks: Vec<Span> = s.stray.into_iter().collect();
        for (v, waiter) in s.waiters.iter().enumerate() {
            if v != w
                && !waiter.gone
                && let Some(p) = waiter.place
            {
                locks.push((p.at, 1));
            }
        }
        locks
    }

    /// `F_OFD_GETLK` for waiter `w`: of the locks others hold on the range, the one that
    /// starts last.
    fn held(s: &LineState, w: usize) -> impl FnMut(i64, i64) -> Option<Span> + use<> {
        let locks = Self::locks(s, w);
        move |from, n| {
            locks
                .iter()
                .copied()
                .filter(|&l| overlaps(l, from, n))
                .max_by_key(|&(start, _)| start)
        }
    }

    /// The stopped places and stray locks ahead of waiter `w`, and whether a running waiter is
    /// ahead of it.
    fn ahead(s: &LineState, w: usize) -> (u32, bool) {
        let Some(me) = s.waiters[w].place else {
            return (0, false);
        };
        let mut stopped = u32::from(s.stray.is_some_and(|(start, _)| start < me.at));
        let mut running = false;
        for waiter in &s.waiters {
            match waiter.place {
                Some(p) if p.at < me.at && !waiter.gone => {
                    if waiter.stopped {
                        stopped += 1;
                    } else {
                        running = true;
                    }
                }
                _ => {}
            }
        }
        (stopped, running)
    }

    /// The documented bound for `k` stopped places ahead, in ticks, plus the tick a waiter
    /// that looks once per tick may lose.
    fn bound(k: u32) -> u8 {
        let grace = match k {
            0 => Duration::ZERO,
            k => line::HANDOFF_GRACE + line::NEXT_GRACE * (k - 1),
        };
        u8::try_from(grace.as_millis().div_ceil(TICK.as_millis())).unwrap_or(u8::MAX) + 1
    }

    /// Whether waiter `w` has waited longer than the bound on a free lease with no running
    /// waiter ahead.
    fn late(s: &LineState, w: usize) -> bool {
        let waiter = &s.waiters[w];
        let Some(since) = s.free_since else {
            return false;
        };
        if waiter.gone || waiter.stopped || s.holder.is_some() {
            return false;
        }
        let (k, running_ahead) = Self::ahead(s, w);
        !running_ahead && s.now - since > Self::bound(k)
    }

    /// Whether waiter `w`'s instance holds the id by its flag at the model's time (the
    /// adapter's `held_here`: until the flag's expiry, by `machine::is_expired`): it then tries
    /// at once, and its look does not ask the line.
    pub fn held_here(s: &LineState, w: usize) -> bool {
        s.waiters[w].sibling
            && s.held
                .is_some_and(|until| !flocklease::machine::is_expired(until, at(s.now)))
    }

    fn look(&self, s: &mut LineState, w: usize) {
        let now = TICK * u32::from(s.now);
        let mut held = Self::held(s, w);
        let mut waiter = s.waiters[w];
        let held_here = Self::held_here(s, w);
        // The record as the look reads it.
        let token = Some(s.token);
        s.own_look |= waiter.sibling && s.closing;
        // Its look reads the flag as holding: only right while the instance holds the lease.
        // (The adapter's attempt is a step after its look: a release by another thread of the
        // instance that commits between them lets that attempt go out of the line's order,
        // PROTOCOL §9.2; the model's look and attempt are one step, so the property is about
        // the flag the look reads.)
        s.skipped |= held_here && s.holder != Some(Who::Holder);
        let turn = match (waiter.place.as_mut(), self.planted) {
            // Its instance holds the id: it tries at once (`acquire_wait`'s look).
            _ if held_here => true,
            // Unqueued: always tries.
            (None, _) => true,
            // The adapter's look.
            (Some(place), None) => place.may_try(&mut waiter.yielded, now, || token, &mut held),
            // The look with a planted mistake: `Place::may_try` written out, one part wrong.
            (Some(place), Some(LinePlanted::HeldUntilClose)) => {
                place.may_try(&mut waiter.yielded, now, || token, &mut held)
            }
            (Some(place), Some(planted)) => {
                let mut turn = place.turn(&mut held);
                if !turn {
                    waiter.yielded.seen(|| token);
                    if !waiter.yielded.counting() {
                        place.after = -1;
                    }
                }
                if !turn && waiter.yielded.grace_over(now) {
                    let found = if planted == LinePlanted::PassOverReported {
                        place.ahead(&mut held)
                    } else {
                        place.earliest_ahead(&mut held)
                    };
                    if let Some(mut span) = found {
                        if planted == LinePlanted::PassOverFirstByte {
                            span.1 = 1;
                        }
                        place.pass_over(span);
                    }
                    waiter.yielded.passed_over(now);
                    if planted == LinePlanted::WholeGraceEach {
                        waiter.yielded = Yielded::default();
                        waiter.yielded.let_go(now, Some(s.token));
                    }
                    turn = place.turn(&mut held);
                }
                turn
            }
        };
        waiter.looked = true;
        let passed = (
            s.waiters[w].place.map_or(-1, |p| p.after),
            waiter.place.map_or(-1, |p| p.after),
        );
        s.overtook |= Self::passes_running(s, w, passed);
        if turn && s.holder.is_none() {
            // Granted with a running waiter ahead that it did not pass over (its look found
            // its turn anyway): an overtaking too. Its instance's own waiter skips the line
            // while the instance holds the lease (judged apart), and an unqueued one has no
            // place in it.
            s.overtook |= !held_here
                && waiter.place.is_some_and(|me| {
                    s.waiters.iter().enumerate().any(|(v, other)| {
                        v != w
                            && !other.gone
                            && !other.stopped
                            && other.place.is_some_and(|p| me.after < p.at && p.at < me.at)
                    })
                });
            let (k, _) = Self::ahead(s, w);

            if k > 0 {
                s.past_stopped |= s.waiters.iter().any(|v| {
                    v.stopped
                        && !v.gone
                        && v.place.zip(waiter.place).is_some_and(|(a, b)| a.at < b.at)
                });
                s.past_span |= s.stray.is_some_and(|(start, len)| {
                    len != 1 && waiter.place.is_some_and(|p| start < p.at)
                });
            }
            waiter.gone = true;
            s.holder = Some(Who::Waiter(w));
            s.token += 1;
            s.free_since = None;
            // A grant: every count starts again.
            for v in &mut s.waiters {
                v.free_from = None;
            }
            waiter.free_from = None;
        } else if s.holder.is_none() {
            waiter.yielded.let_go(now, Some(s.token));
            waiter.free_from.get_or_insert(s.now);
        } else {
            waiter.yielded.saw_held();
            waiter.free_from = None;
        }
        s.waiters[w] = waiter;
    }

    /// Whether waiter `w`, passing over the places in `(from, to]` (`passed`), passes a running
    /// waiter that has not let the lease go for the whole hand-off grace: the pass-over passes
    /// a place only once the lease has been free, with no grant, for that long (PROTOCOL
    /// §4.6), and a running waiter whose turn comes takes the lease at its next look. (A
    /// running waiter is passed when its own count began a look later, by the model's tick
    /// of 10 ms as long as the next place's grace; the adapter's looks are 200 µs apart.)
    fn passes_running(s: &LineState, w: usize, (from, to): (i64, i64)) -> bool {
        let grace =
            u8::try_from(line::HANDOFF_GRACE.as_millis() / TICK.as_millis()).unwrap_or(u8::MAX);
        to > from
            && s.waiters.iter().enumerate().any(|(v, waiter)| {
                v != w
                    && !waiter.gone
                    && !waiter.stopped
                    && waiter.place.is_some_and(|p| from < p.at && p.at <= to)
                    && waiter
                        .free_from
                        .is_none_or(|since| s.now.saturating_sub(since) < grace)
            })
    }
}

impl Model for LineModel {
    type State = LineState;
    type Action = LineAction;

    fn init_states(&self) -> Vec<LineState> {
        let strays = [None, Some((0, 1)), Some((0, 2)), Some((1, 1)), Some((1, 0))];
        strays
            .into_iter()
            .map(|stray| {
                // The waiters join in order while the holder holds the lease.
                // Without a stray lock the file may be new: its first waiter's place is byte 0
                // (a look that ignored the file's first bytes would pass it).
                let mut end = if stray.is_none() { 0 } else { EARLIER };
                let waiters = (0..self.waiters)
                    .map(|w| {
                        let mut place = None;
                        for _ in 0..3 {
                            let at = end;
                            end += 1;
                            if !stray.is_some_and(|l| covers(l, at)) {
                                place = Some(Place::new(at));
                                break;
                            }
                        }
                        Waiter {
                            place,
                            yielded: Yielded::default(),
                            stopped: false,
                            gone: false,
                            looked: false,
                            sibling: self.sibling && w + 1 == self.waiters,
                            free_from: None,
                        }
                    })
                    .collect();
                LineState {
                    now: 0,
                    holder: Some(Who::Holder),
                    token: 1,
                    stray,
                    waiters,
                    stops_left: self.stops,
                    free_since: None,
                    past_stopped: false,
                    past_span: false,
                    // The holder's instance holds the id, until its record's expiry.
                    held: self.sibling.then(|| at(HOLDER_EXPIRY)),
                    closing: false,
                    skipped: false,
                    own_look: false,
                    overtook: false,
                }
            })
            .collect()
    }

    fn actions(&self, s: &LineState, actions: &mut Vec<LineAction>) {
        let running = |w: &Waiter| !w.stopped && !w.gone;
        if s.now < self.max_time && s.waiters.iter().filter(|w| running(w)).all(|w| w.looked) {
            actions.push(LineAction::Tick);
        }
        if s.closing {
            actions.push(LineAction::Close);
        }
        match s.holder {
            Some(Who::Holder) => actions.push(LineAction::Release),
            Some(Who::Waiter(w)) if !s.waiters[w].stopped => actions.push(LineAction::Release),
            _ => {}
        }
        for (w, waiter) in s.waiters.iter().enumerate() {
            if running(waiter) && !waiter.looked {
                actions.push(LineAction::Look(w));
            }
            if running(waiter) && s.stops_left > 0 {
                actions.push(LineAction::Stop(w));
            }
        }
    }

    fn next_state(&self, last: &LineState, action: LineAction) -> Option<LineState> {
        let mut s = last.clone();
        match action {
            LineAction::Tick => {
                s.now += 1;
                for w in &mut s.waiters {
                    w.looked = false;
                }
            }
            LineAction::Release => {
                if s.holder == Some(Who::Holder) && self.sibling {
                    // The release's commit point: the tombstone, and the instance's flag from
                    // it (planted: left as it was, for the close to take down).
                    if self.planted != Some(LinePlanted::HeldUntilClose) {
                        // A tombstone keeps the token and expires at the release's time.
                        let tombstone = flocklease::Record {
                            owner: String::new(),
                            token: s.token,
                            expiry: at(s.now),
                        };
                        s.held = flocklease::machine::held_until(Some(&tombstone));
                    }
                    s.closing = true;
                }
                s.holder = None;
                s.free_since = Some(s.now);
            }
            LineAction::Close => {
                // The transition ends without a generation: the flag is down.
                s.held = None;
                s.closing = false;
            }
            LineAction::Look(w) => self.look(&mut s, w),
            LineAction::Stop(w) => {
                s.waiters[w].stopped = true;
                s.stops_left -= 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(WITHIN_BOUND, |_, s: &LineState| {
                !(0..s.waiters.len()).any(|w| LineModel::late(s, w))
            }),
            Property::sometimes(PAST_STOPPED, |_, s: &LineState| s.past_stopped),
            Property::sometimes(PAST_SPAN, |_, s: &LineState| s.past_span),
            Property::always(OWN_ORDER, |_, s: &LineState| !s.skipped),
            Property::always(IN_ORDER, |_, s: &LineState| !s.overtook),
            Property::sometimes(OWN_LOOK, |_, s: &LineState| s.own_look),
        ]
    }
}

impl fmt::Display for LineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={} token {} ", self.now, self.token)?;
        match self.holder {
            None => write!(f, "free since {}", self.free_since.unwrap_or(self.now))?,
            Some(Who::Holder) => write!(f, "held by the holder")?,
            Some(Who::Waiter(w)) => write!(f, "held by w{w}")?,
        }
        if self.held.is_some() {
            write!(f, " | the holder's instance's flag set")?;
        }
        if self.closing {
            write!(f, " (its release not ended)")?;
        }
        if let Some((start, len)) = self.stray {
            let end = if len == 0 {
                "end".to_owned()
            } else {
                (start + len - 1).to_string()
            };
            write!(f, " | stray lock {start}..{end}")?;
        }
        for (w, waiter) in self.waiters.iter().enumerate() {
            write!(f, " | w{w} ")?;
            match waiter.place {
                Some(p) => write!(f, "at {} passed to {}", p.at, p.after)?,
                None => write!(f, "unqueued")?,
            }
            if waiter.sibling {
                write!(f, " (the holder's instance)")?;
            }
            if waiter.gone {
                write!(f, " granted")?;
            } else if waiter.stopped {
                write!(f, " STOPPED")?;
            }
        }
        Ok(())
    }
}

impl SmallModel for LineModel {
    type Planted = LinePlanted;
    const CONFIG: &'static str = "line";
    const TITLE: &'static str = "the waiting line";
    const PLANTED: &'static [(&'static str, LinePlanted)] = &[
        ("pass-over-first-byte", LinePlanted::PassOverFirstByte),
        ("whole-grace-each", LinePlanted::WholeGraceEach),
        ("pass-over-reported", LinePlanted::PassOverReported),
        ("held-until-close", LinePlanted::HeldUntilClose),
    ];
    const BREAKS: &'static str = "the lease has been free longer than the bound while a running \
         waiter with nobody running ahead of it waits, a waiter was granted past a running \
         waiter ahead of it, or the holder's instance's waiter was granted out of the line's \
         order while its instance did not hold the lease";

    fn planted_mut(&mut self) -> Option<&mut Option<LinePlanted>> {
        Some(&mut self.planted)
    }

    fn header(&self) -> String {
        format!(
            "the line of waiting acquires (PROTOCOL §4.6): {} waiters{}, up to {} stopped, a \
             stray lock of any span, a holder; a tick is 10 ms, clock to {}",
            self.waiters,
            if self.sibling {
                " (the last of the holder's own instance)"
            } else {
                ""
            },
            self.stops,
            self.max_time,
        )
    }
}

#[cfg(test)]
mod tests {
    use stateright::Checker;

    use super::*;
    use crate::harness;

    #[test]
    fn the_default_configuration_holds() {
        // Pinned: a change to the actors or the rule that moves it must say why. (414 550
        // before the last waiter became the holder's instance's, with the release in two
        // steps; 1 222 736 before a grant or a holder seen made the pass-over start again and
        // each waiter's ghost count of the lease let go came in, for the order property;
        // without the sibling: 414 550 then, 320 690 now.)
        harness::assert_holds(LineModel::default(), 948_617);
        let without = LineModel {
            sibling: false,
            ..LineModel::default()
        };
        assert_eq!(harness::explore(without).unique_state_count(), 320_690);
    }

    #[test]
    fn a_flag_that_follows_the_generation_fails_the_check() {
        harness::assert_caught::<LineModel>(LinePlanted::HeldUntilClose, OWN_ORDER);
    }

    #[test]
    fn a_pass_over_of_the_reported_lock_overtakes_and_fails_the_order() {
        let failed = harness::assert_caught::<LineModel>(LinePlanted::PassOverReported, IN_ORDER);
        // The bound alone does not see it: overtaking is fast.
        assert!(!failed.contains(&WITHIN_BOUND), "{failed:?}");
    }

    #[test]
    fn a_planted_mistake_fails_the_check() {
        for planted in [LinePlanted::PassOverFirstByte, LinePlanted::WholeGraceEach] {
            harness::assert_caught::<LineModel>(planted, WITHIN_BOUND);
        }
    }
}
