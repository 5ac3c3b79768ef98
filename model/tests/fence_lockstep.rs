//! Lockstep of a resource's own `Fence` (PROTOCOL §9.4) on the kernel with the same `Fence` on
//! the model's simulated file system (`check --config resource-fence`,
//! `flocklease_model::resource`): it checks that the simulated files answer as the kernel's do.
//! Each model writer is a real `Fence` on its own thread — `write_file(token, target, …)` or
//! `with(token, write the target)` — whose fault seam is used only as a scheduler: the writer
//! pauses before each call the model makes a step of (the lock's one attempt — open, `flock`,
//! check — check the lock is the file at the path, read the fence file, rename a new fence file
//! or the target, the closure's write, unlock), and goes on by one step when the model's writer
//! does. The cleaner's deletions, moves aside and puts back are done on the real lock file.
//! After every action the files are compared with the model's state: the fence file's token,
//! the target's token, which lock file stands at the path and aside, where each writer is, and
//! what each call that returned answered (admitted and what it read, refused and the greater
//! token, or failed; `write_file`'s answer classified by `Admission::is_admitted`).
//!
//! Schedules: seeded random walks of the model (every action it allows, chosen at random). A
//! divergence fails with the seed and the actions so far.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use flocklease::fault::{FaultHook, FaultPoint};
use flocklease::{Admission, Fence};
use flocklease_model::report::SplitMix;
use flocklease_model::resource::{
    ASIDE, Call, Ended, How, LOCK, ResourceAction, ResourceModel, ResourceState,
};
use stateright::Model;

/// How many seeded random walks.
const WALKS: u64 = 3_000;

/// Where a real writer is paused (or that it returned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// Before the step this fault point names.
    Point(FaultPoint),
    /// `with`'s closure, before its write.
    Write,
    /// Returned.
    Done,
}

/// The point a real writer pauses at before the model's step that makes `call` (`None`: the
/// call has ended).
fn expected(call: Option<Call>) -> At {
    match call {
        Some(Call::Lock) => At::Point(FaultPoint::OpenStable),
        Some(Call::StillAt) => At::Point(FaultPoint::StatStable),
        Some(Call::Read) => At::Point(FaultPoint::OpenRecord),
        Some(Call::RenameFence) => At::Point(FaultPoint::Rename),
        Some(Call::RenameTarget) => At::Point(FaultPoint::CommitTarget),
        Some(Call::Write) => At::Write,
        Some(Call::Unlock) => At::Point(FaultPoint::UnlockFence),
        None => At::Done,
    }
}

/// One real writer: its thread, and the channel that lets it take its next step.
struct Writer {
    go: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

/// The real side of one walk.
struct Real {
    dir: tempfile::TempDir,
    writers: Vec<Writer>,
    /// Where each writer is paused.
    at: Vec<At>,
    reports: Receiver<(usize, At)>,
    /// The model's lock inodes and the real ones.
    inodes: HashMap<u8, u64>,
    /// What each writer's call answered, once it returned.
    answers: Arc<Mutex<Vec<Option<String>>>>,
}

/// An answer as the comparison writes it: what the model's writer ended with (classified by
/// its own variant, not by the library's `is_admitted`, which the real side's answer uses).
fn answer(ended: Ended) -> String {
    match ended {
        Ended::Admitted { previous } => {
            format!("admitted: {:?}", Admission::Admitted { previous })
        }
        Ended::Refused { highest } => format!("refused: {:?}", Admission::Refused { highest }),
        Ended::Failed => "failed".to_owned(),
    }
}

/// What a real `write_file` answered, as the comparison writes it: classified by
/// `Admission::is_admitted`, and itself.
fn said(a: Admission) -> String {
    let kind = if a.is_admitted() {
        "admitted"
    } else {
        "refused"
    };
    format!("{kind}: {a:?}")
}

impl Real {
    fn fence_path(&self) -> PathBuf {
        self.dir.path().join("f")
    }
    fn lock_path(&self) -> PathBuf {
        self.dir.path().join("f.lock")
    }
    fn aside_path(&self) -> PathBuf {
        self.dir.path().join("aside")
    }
    fn target_path(&self) -> PathBuf {
        self.dir.path().join("target")
    }

    fn start(m: &ResourceModel) -> Real {
        let dir = tempfile::tempdir().unwrap();
        // The fences are opened by a bare name, a file of the working directory (as the command
        // line's `--fence f` is): this binary's one test is alone in its process, so the
        // working directory is its own to set. The fence names its file `./f`.
        std::env::set_current_dir(dir.path()).unwrap();
        let fence_path = Path::new(".").join("f");
        let target = dir.path().join("target");
        let (report, reports) = channel();
        let answers = Arc::new(Mutex::new(vec![None; m.writers.len()]));
        let mut writers = vec![];
        for (i, &(token, how)) in m.writers.iter().enumerate() {
            let (go, wait) = channel::<()>();
            let wait = Arc::new(Mutex::new(wait));
            let armed = Arc::new(AtomicBool::new(false));
            let hook: FaultHook = {
                let (report, wait, armed) = (report.clone(), Arc::clone(&wait), Arc::clone(&armed));
                let fence_path = fence_path.clone();
                Arc::new(move |point, path: &Path| {
                    let step = match point {
                        FaultPoint::OpenStable
                        | FaultPoint::LockStable
                        | FaultPoint::StatStable
                        | FaultPoint::CommitTarget
                        | FaultPoint::UnlockFence => true,
                        FaultPoint::OpenRecord | FaultPoint::Rename => path == fence_path,
                        _ => false,
                    };
                    if step && armed.load(Ordering::SeqCst) {
                        pause(&report, &wait, i, At::Point(point));
                    }
                    None
                })
            };
            let fence = Fence::builder("f").faults(hook).open().unwrap();
            armed.store(true, Ordering::SeqCst);
            let (report, target, answers) = (report.clone(), target.clone(), Arc::clone(&answers));
            let thread = std::thread::spawn(move || {
                let bytes = format!("{token}\n");
                let real = match how {
                    How::WriteFile => match fence.write_file(token, &target, bytes.as_bytes()) {
                        Ok(a) => said(a),
                        Err(_) => answer(Ended::Failed),
                    },
                    How::With => answer(
                        match fence.with(token, || {
                            pause(&report, &wait, i, At::Write);
                            fs::write(&target, bytes.as_bytes()).unwrap();
                        }) {
                            Ok(Ok(())) => Ended::Admitted { previous: None },
                            Ok(Err(stale)) => Ended::Refused {
                                highest: stale.highest,
                            },
                            Err(_) => Ended::Failed,
                        },
                    ),
                };
                answers.lock().unwrap()[i] = Some(real);
                let _ = report.send((i, At::Done));
            });
            writers.push(Writer {
                go,
                thread: Some(thread),
            });
        }
        let mut real = Real {
            dir,
            writers,
            at: vec![At::Done; m.writers.len()],
            reports,
            inodes: HashMap::new(),
            answers,
        };
        // Opening the fences created the lock file; the model starts without one.
        fs::remove_file(real.lock_path()).unwrap();
        for _ in 0..m.writers.len() {
            let (i, at) = real.reports.recv().unwrap();
            real.at[i] = at;
        }
        real
    }

    /// Lets writer `i` take one step and waits until it pauses again (or returns). The
    /// lock's one attempt is one step: the open, then the `flock`, then the check.
    fn step(&mut self, i: usize) {
        let within = if self.at[i] == At::Point(FaultPoint::OpenStable) {
            2
        } else {
            0
        };
        for _ in 0..=within {
            self.writers[i].go.send(()).unwrap();
            let (j, at) = self.reports.recv().unwrap();
            assert_eq!(i, j, "another writer moved");
            self.at[i] = at;
        }
        if self.at[i] == At::Done
            && let Some(t) = self.writers[i].thread.take()
        {
            t.join().unwrap();
        }
    }

    fn inode_at(&self, path: &Path) -> Option<u64> {
        fs::symlink_metadata(path).ok().map(|m| m.ino())
    }

    fn token_in(path: &Path) -> Option<u64> {
        let text = fs::read_to_string(path).ok()?;
        Some(text.trim_end().parse().unwrap())
    }

    /// Compares the real files and writers with the model's state `s` (after `last`).
    fn compare(&mut self, last: Option<&ResourceState>, s: &ResourceState) -> Result<(), String> {
        // A lock file the model just made gets its real inode (the model gives a freed
        // inode's number to its next file).
        for (name, path) in [(LOCK, self.lock_path()), (ASIDE, self.aside_path())] {
            if let Some(&k) = s.files.names.get(name)
                && last.is_none_or(|l| !l.files.inodes.contains_key(&k))
                && let Some(ino) = self.inode_at(&path)
            {
                self.inodes.insert(k, ino);
            }
        }
        let model_at = |name: &str| {
            s.files
                .names
                .get(name)
                .map(|k| self.inodes.get(k).copied().unwrap_or(0))
        };
        let checks = [
            (
                "the lock file at its path",
                format!("{:?}", model_at(LOCK)),
                format!("{:?}", self.inode_at(&self.lock_path())),
            ),
            (
                "the lock file aside",
                format!("{:?}", model_at(ASIDE)),
                format!("{:?}", self.inode_at(&self.aside_path())),
            ),
            (
                "the fence file's token",
                format!("{:?}", s.files.token_at(flocklease_model::resource::FENCE)),
                format!("{:?}", Self::token_in(&self.fence_path())),
            ),
            (
                "the target's token",
                format!("{:?}", s.files.token_at(flocklease_model::resource::TARGET)),
                format!("{:?}", Self::token_in(&self.target_path())),
            ),
            (
                "where the writers are",
                format!(
                    "{:?}",
                    s.writers
                        .iter()
                        .map(|w| expected(w.next))
                        .collect::<Vec<_>>()
                ),
                format!("{:?}", self.at),
            ),
        ];
        let answers = self.answers.lock().unwrap().clone();
        let checks = checks.into_iter().chain([(
            "what the returned calls answered",
            format!(
                "{:?}",
                s.writers
                    .iter()
                    .map(|w| w.next.is_none().then(|| w.ended.map(answer)).flatten())
                    .collect::<Vec<_>>()
            ),
            format!("{answers:?}"),
        )]);
        for (what, model, real) in checks {
            if model != real {
                return Err(format!("{what}: model {model}, real {real}"));
            }
        }
        Ok(())
    }

    fn act(&mut self, a: ResourceAction) {
        match a {
            ResourceAction::Step(i) => self.step(i),
            ResourceAction::DeleteLock => fs::remove_file(self.lock_path()).unwrap(),
            ResourceAction::MoveAside => fs::rename(self.lock_path(), self.aside_path()).unwrap(),
            ResourceAction::PutBack => fs::rename(self.aside_path(), self.lock_path()).unwrap(),
        }
    }

    /// Lets every writer run to its end (after a divergence or at the end of a walk).
    fn finish(mut self) {
        for w in &mut self.writers {
            while let Some(t) = w.thread.take() {
                if t.is_finished() {
                    t.join().unwrap();
                } else {
                    let _ = w.go.send(());
                    w.thread = Some(t);
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// A writer's pause: says where it is, and waits for its turn.
fn pause(report: &Sender<(usize, At)>, wait: &Mutex<Receiver<()>>, i: usize, at: At) {
    let _ = report.send((i, at));
    let _ = wait.lock().unwrap().recv();
}

/// A seeded random walk of `m`, run in lockstep: the number of actions compared.
fn walk(m: &ResourceModel, seed: u64) -> Result<usize, String> {
    let mut rng = SplitMix::new(seed);
    let mut s = m.init_states().remove(0);
    let mut real = Real::start(m);
    let mut done = vec![];
    let result = (|| {
        real.compare(None, &s)?;
        loop {
            let mut actions = vec![];
            m.actions(&s, &mut actions);
            // A writer whose step blocks (the lock held by another) is not scheduled.
            actions.retain(|&a| m.next_state(&s, a).is_some());
            if actions.is_empty() {
                return Ok(done.len());
            }
            let a = actions.swap_remove(rng.below(actions.len()));
            let next = m.next_state(&s, a).expect("kept above");
            real.act(a);
            done.push(a);
            real.compare(Some(&s), &next)
                .map_err(|e| format!("seed {seed}, after {done:?}: {e}"))?;
            s = next;
        }
    })();
    real.finish();
    result
}

#[test]
fn the_real_fence_follows_its_model_step_by_step() {
    let m = ResourceModel::default();
    let mut steps = 0;
    for seed in 0..WALKS {
        steps += walk(&m, seed).unwrap_or_else(|e| panic!("{e}"));
    }
    eprintln!("fence lockstep: {WALKS} walks, {steps} actions compared, no divergence");
}
