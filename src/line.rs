//! The line of waiting acquires' rule (PROTOCOL §4.6) as pure code, run by the flock backend's
//! waiters (`flock::queue`, which does the system calls) and by the model checker's line model:
//! whose turn it is, what a pass-over passes, and how long a free lease is left to the places
//! ahead.
//!
//! The only input from the kernel is `held(start, len)`: `F_OFD_GETLK` on `len` bytes from
//! `start` (`len` 0: to the end and beyond), which reports **one** lock another open file
//! description holds there, if any, as its start and length (0: to the end and beyond). Of
//! several, the kernel reports any one; the rule never assumes which.

use std::time::Duration;

/// How long a waiter that is not first lets a free lease go to the first one before it tries
/// too: the first waiter may be stopped (`SIGSTOP`) or starved of CPU. Well above the longest
/// pause of a wait's loop (10 ms), far below any TTL.
pub const HANDOFF_GRACE: Duration = Duration::from_millis(50);

/// The grace for each further place ahead once a wait has passed one over, with no grant to
/// anyone since: a waiter that is alive and next has been looking all along and tries as soon
/// as the place before it is passed, so a few polls are enough. K stopped waiters ahead then
/// cost `HANDOFF_GRACE + (K - 1) × NEXT_GRACE`, not `K × HANDOFF_GRACE`.
pub const NEXT_GRACE: Duration = Duration::from_millis(10);

/// A lock on the line's file: its start and length (0: to the end and beyond).
pub type Span = (i64, i64);

/// A waiter's place: the byte it holds locked, and how far it has passed over the places
/// ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    /// The offset of the byte this waiter holds locked.
    pub at: i64,
    /// Locks ending at or before this offset do not count any more (passed over); -1: none
    /// passed over.
    pub after: i64,
}

impl Place {
    /// The place at byte `at`, nothing passed over.
    pub fn new(at: i64) -> Place {
        Place { at, after: -1 }
    }

    /// Whether this waiter's turn has come: no lock held by others on a byte between the
    /// last one passed over and its own.
    pub fn turn(&self, held: impl FnMut(i64, i64) -> Option<Span>) -> bool {
        self.ahead(held).is_none()
    }

    /// One lock held by others ahead of this place (but those passed over), if any.
    pub fn ahead(&self, mut held: impl FnMut(i64, i64) -> Option<Span>) -> Option<Span> {
        let from = self.after + 1;
        (from < self.at)
            .then(|| held(from, self.at - from))
            .flatten()
    }

    /// The earliest lock held by others ahead of this place (but those passed over): the
    /// kernel reports any one lock of a range, so look again before it until there is none.
    pub fn earliest_ahead(&self, mut held: impl FnMut(i64, i64) -> Option<Span>) -> Option<Span> {
        let from = self.after + 1;
        let mut earliest = None;
        let mut to = self.at;
        while from < to {
            match held(from, to - from) {
                // A lock that starts before `from` overlaps it: it is the earliest.
                Some((start, len)) if start < from => return Some((start, len)),
                Some((start, len)) if start < to => {
                    earliest = Some((start, len));
                    to = start;
                }
                _ => break,
            }
        }
        earliest
    }

    /// One look of a waiter in the line at `now` (its own clock, as [`Yielded`] counts it),
    /// with the record's token as it reads it now (`token`, asked only while a count runs):
    /// whether it may try to acquire. Its turn
    /// has come; or the lease has been left free to the earliest place ahead for that place's
    /// grace ([`Yielded::grace_over`], counted again if someone was served since the count
    /// began: [`Yielded::seen`]), and once that place is passed over (the whole span of its
    /// lock, [`Place::pass_over`]) it is this waiter's turn. The flock backend's waits and the
    /// model's waiters look with this.
    pub fn may_try(
        &mut self,
        yielded: &mut Yielded,
        now: Duration,
        token: impl FnOnce() -> Option<u64>,
        mut held: impl FnMut(i64, i64) -> Option<Span>,
    ) -> bool {
        if self.turn(&mut held) {
            return true;
        }
        yielded.seen(token);
        if !yielded.counting() {
            // No count runs (a holder was seen, or someone was served since the count began):
            // what was passed over was passed in an earlier free period, and counts no more —
            // a place ahead that was stopped then may be running now, and one that is still
            // stopped is passed again within the bound.
            self.after = -1;
        }
        if !yielded.grace_over(now) {
            return false;
        }
        if let Some(span) = self.earliest_ahead(&mut held) {
            self.pass_over(span);
        }
        yielded.passed_over(now);
        self.turn(held)
    }

    /// Passes over `span` (a lock ahead, as [`Place::earliest_ahead`] found it), the whole of
    /// it: a lock of several bytes that is no waiter's place is passed at once (no waiter's
    /// byte can lie under it, since write locks conflict).
    pub fn pass_over(&mut self, (start, len): Span) {
        let end = if len == 0 {
            self.at - 1
        } else {
            start.saturating_add(len - 1).min(self.at - 1)
        };
        self.after = self.after.max(end);
    }
}

/// How long a waiter that is not first has let a free lease go without the record moving on
/// (a grant to anyone makes progress). Times are on one monotonic clock of the caller's (the
/// adapter: since the wait began; the model: its ticks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Yielded {
    /// Since when, and the record's token then (`None`: no record).
    since: Option<(Duration, Option<u64>)>,
    /// A place was passed over with no grant to anyone since: the next one gets
    /// [`NEXT_GRACE`].
    passed: bool,
}

impl Yielded {
    /// The lease was seen free at `now` with the record at `token`, and it is an earlier
    /// waiter's turn: counts from the first such moment (a token other than the one seen
    /// before means someone was served meanwhile, and the count starts again, with the whole
    /// grace).
    pub fn let_go(&mut self, now: Duration, token: Option<u64>) {
        match self.since {
            Some((_, seen)) if seen == token => {}
            Some(_) => {
                self.since = Some((now, token));
                self.passed = false;
            }
            None => self.since = Some((now, token)),
        }
    }

    /// The record was read at `token`: if the count began at another token, someone was
    /// served since (a grant and, between two looks, perhaps its release too), and the count
    /// starts again from nothing — no place ahead is passed over on a count that predates a
    /// grant (the model's line found a waiter passing a running one so: `check --config line`,
    /// "no waiter in the line is granted past a running waiter ahead of it ...").
    /// `token` is asked only while a count runs (a read of the record, for the adapter).
    pub fn seen(&mut self, token: impl FnOnce() -> Option<u64>) {
        if let Some((_, at)) = self.since
            && at != token()
        {
            *self = Yielded::default();
        }
    }

    /// Whether a count runs: the lease was let go, and neither a holder nor a grant was seen
    /// since.
    pub fn counting(&self) -> bool {
        self.since.is_some()
    }

    /// A live holder was seen: nobody is holding the line up.
    pub fn saw_held(&mut self) {
        *self = Yielded::default();
    }

    /// A place ahead was passed over at `now`: the next one ahead, if any, gets
    /// [`NEXT_GRACE`] (counted from now, with the record's token as seen: a grant to anyone
    /// since still gives the next place the whole grace).
    pub fn passed_over(&mut self, now: Duration) {
        self.since = self.since.map(|(_, token)| (now, token));
        self.passed = true;
    }

    /// Whether the lease has stayed free, with no grant to anyone, for [`HANDOFF_GRACE`]
    /// ([`NEXT_GRACE`] right after a pass-over) at `now`: the waiter ahead is not taking it.
    pub fn grace_over(&self, now: Duration) -> bool {
        let grace = if self.passed {
            NEXT_GRACE
        } else {
            HANDOFF_GRACE
        };
        self.since
            .is_some_and(|(t, _)| now.saturating_sub(t) >= grace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's `F_OFD_GETLK` over `locks`, reporting the *last* overlapping one (the rule
    /// must not depend on which).
    fn getlk(locks: &[Span]) -> impl FnMut(i64, i64) -> Option<Span> + '_ {
        move |from, len| {
            let end = if len == 0 { i64::MAX } else { from + len };
            locks.iter().rev().copied().find(|&(s, l)| {
                let e = if l == 0 { i64::MAX } else { s + l };
                s < end && from < e
            })
        }
    }

    #[test]
    fn a_span_of_several_bytes_is_passed_at_once() {
        let locks = [(0, 3), (5, 1)];
        let mut place = Place::new(6);
        assert_eq!(place.earliest_ahead(getlk(&locks)), Some((0, 3)));
        place.pass_over((0, 3));
        assert_eq!(place.after, 2);
        assert_eq!(place.earliest_ahead(getlk(&locks)), Some((5, 1)));
        place.pass_over((5, 1));
        assert!(place.turn(getlk(&locks)));
    }

    #[test]
    fn a_lock_to_the_end_is_passed_up_to_the_place() {
        let locks = [(1, 0)];
        let mut place = Place::new(4);
        assert!(!place.turn(getlk(&locks)));
        let span = place.earliest_ahead(getlk(&locks)).unwrap();
        place.pass_over(span);
        assert_eq!(place.after, 3);
        assert!(place.turn(getlk(&locks)));
    }

    #[test]
    fn the_earliest_is_found_whichever_lock_the_kernel_reports() {
        let locks = [(0, 1), (1, 1), (2, 1)];
        assert_eq!(
            Place::new(3).earliest_ahead(getlk(&locks)),
            Some((0, 1)),
            "the oracle reports the last one"
        );
    }

    #[test]
    fn a_look_passes_one_place_per_grace() {
        let ms = Duration::from_millis;
        // Two places ahead, neither taking the free lease.
        let locks = [(0, 1), (1, 1)];
        let (mut place, mut y) = (Place::new(2), Yielded::default());
        y.let_go(ms(0), Some(1));
        assert!(!place.may_try(&mut y, ms(49), || Some(1), getlk(&locks)));
        assert_eq!(place.after, -1);
        // The first one's grace is over: it is passed, the second one is still ahead.
        assert!(!place.may_try(&mut y, ms(50), || Some(1), getlk(&locks)));
        assert_eq!(place.after, 0);
        // The second one gets the short grace from the pass-over, not none.
        assert!(!place.may_try(&mut y, ms(59), || Some(1), getlk(&locks)));
        assert_eq!(place.after, 0);
        assert!(place.may_try(&mut y, ms(60), || Some(1), getlk(&locks)));
        assert_eq!(place.after, 1);
    }

    #[test]
    fn further_places_get_the_short_grace_until_someone_is_served() {
        let ms = Duration::from_millis;
        let mut y = Yielded::default();
        assert!(!y.grace_over(ms(0)));
        y.let_go(ms(0), Some(1));
        y.let_go(ms(30), Some(1));
        assert!(!y.grace_over(ms(49)));
        assert!(y.grace_over(ms(50)));
        y.passed_over(ms(50));
        assert!(!y.grace_over(ms(59)));
        assert!(y.grace_over(ms(60)));
        // A grant meanwhile: the whole grace again.
        y.let_go(ms(61), Some(2));
        assert!(!y.grace_over(ms(71)));
        assert!(y.grace_over(ms(111)));
        y.saw_held();
        assert!(!y.grace_over(ms(1000)));
    }

    #[test]
    fn a_grant_between_two_looks_starts_the_count_and_the_pass_over_again() {
        let ms = Duration::from_millis;
        // A stopped place at 0, a running waiter at 1, this one at 2.
        let locks = [(0, 1), (1, 1)];
        let (mut place, mut y) = (Place::new(2), Yielded::default());
        y.let_go(ms(0), Some(1));
        assert!(!place.may_try(&mut y, ms(50), || Some(1), getlk(&locks)));
        assert_eq!(place.after, 0, "the stopped place is passed");
        // The waiter at 1 was granted and released between two looks: the token moved. The
        // count from before that grant does not pass the waiter at 1, and the stopped place is
        // passed again only after a whole grace of its own.
        assert!(!place.may_try(&mut y, ms(60), || Some(2), getlk(&locks)));
        assert_eq!(place.after, -1);
        assert!(!y.counting());
        y.let_go(ms(60), Some(2));
        assert!(!place.may_try(&mut y, ms(109), || Some(2), getlk(&locks)));
        assert!(!place.may_try(&mut y, ms(110), || Some(2), getlk(&locks)));
        assert_eq!(place.after, 0);
        assert!(place.may_try(&mut y, ms(120), || Some(2), getlk(&locks)));
    }
}
