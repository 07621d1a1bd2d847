//! Command-line flags of the bench (nccl-tests' spellings where they
//! have one), read through the declarative table of `nccl-flags`, as
//! xtask's commands are.

use std::path::PathBuf;
use std::time::Duration;

use nccl_flags::{self as flags, Flag, Parsed, Trailing, switch, value};

use crate::coll::{Coll, Layer};

pub const USAGE: &str = "usage: bench [FLAGS]

What to run:
  --mode single|threads|processes  one thread driving every GPU, a thread per GPU,
                                   or a process per GPU (started by a launcher:
                                   `cargo xtask launch -n N --bin nccl-bench -- --mode processes`)
                                   [threads]
  -g, --gpus N                     GPUs to use, devices 0..N (single/threads) [all]
  --ops LIST                       all_reduce,all_gather,reduce_scatter,broadcast,
                                   reduce,all_to_all,send_recv or `all` [all]
  --layers LIST                    raw,safe,dist,safe_wd,raw_probe or `all` (raw,safe,dist) [all]:
                                   raw calls nccl-sys directly and safe the typed
                                   nccl-safe API, both on a blocking communicator
                                   without watchdog; dist nccl-dist's `dyn
                                   Communicator` on the world made with default
                                   options (not in single mode); safe_wd is safe
                                   with a watchdog observing the same communicator;
                                   raw_probe is raw plus the driver calls the typed
                                   path makes per call (capture status, context
                                   binding), to cost them inside the loop
  -b, --min-bytes SIZE             smallest size (K, M, G suffixes) [8]
  -e, --max-bytes SIZE             largest size [2G]
  -f, --step-factor N              size multiplier between steps [4]
  -d, --dtype T                    f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64 f8e4m3 f8e5m2 [f32]
  -o, --op OP                      sum prod max min avg [sum]
  -r, --root R                     root of broadcast and reduce [0]
  -n, --iters N                    timed iterations per measurement [20]
  -w, --warmup N                   untimed iterations first [5]
  --min-ms MS                      time at least MS per measurement: more iterations
                                   than -n where calls are short (not with --graph) [0]
  --rounds N                       measure each layer N times, interleaved, and
                                   report the median [1]
  --in-place only|both|none        which placements to run [both]
  -G, --graph                      capture the timed iterations in a CUDA graph
                                   and time its replays
  --graph-launches N               replays per measurement in graph mode [10]
  -c, --check full|sampled|off     correctness check after timing: every element,
                                   or every element up to 64 MiB and sampled
                                   blocks above [sampled]
  --cudarc-events                  leave cudarc's per-buffer event tracking on
                                   (it costs CUDA calls on every use of a buffer)
  --nonblocking                    nonblocking communicators (nonblocking_config(),
                                   for every layer); NCCL then launches each group
                                   from a new thread [blocking, as nccl-tests and
                                   nccl-dist's defaults]
  --timeout SECS                   deadline for every wait on the GPUs [120]
  --setup                          time communicator init, DeviceMesh 2x2 creation
                                   and the first all_reduce on each axis instead
  --setup-reps N                   set-up (and --recover) repetitions (the first
                                   set-up rep is cold) [3]
  --mesh-keeps-world               with --setup: DeviceMesh::from_world (the mesh
                                   keeps the world and shares its communicator
                                   where the ranks are the same) instead of
                                   DeviceMesh::new; threads or processes mode
  --fresh-process                  with --setup in processes mode: time the first
                                   world from after the CUDA context is made (state
                                   fresh), not from process start
  --small                          the all_reduce of small messages (-b to -e), f32
                                   and bf16: raw NCCL, ours on plain buffers and ours
                                   on symmetric buffers (SymmetricBuffer), checked;
                                   threads mode
  --recover                        time World::recover after a lost rank (the last
                                   thread panics on purpose; in processes mode the
                                   last process kills itself, one rep a launch)
                                   and the first all_reduce on the new world
  --recover-by-shrink              with --recover: the world recovers by shrink
                                   (WorldOptions::recover_by_shrink(true))
  --recover-give-up                with --recover: the world gives the old one up
                                   instead (recover_by_shrink(false)); without
                                   either, NCCL_RS_RECOVER_BY_SHRINK decides (on)
  --step                           time a training-like step over a 2-D DeviceMesh
                                   (dp x tp) with default options against the same
                                   step in raw nccl-sys calls, interleaved (-n steps
                                   per measurement, -w warm-up steps, --rounds);
                                   threads or processes mode
  --step-raw-mesh                  with --step: a third side, the raw calls on the
                                   mesh's own communicators and stream (splits
                                   default − raw into NCCL's part and ours)
  --async                          time awaiting an 8 B all_reduce (Completion)
                                   against a blocking stream sync, the waker
                                   thread's CPU share, and requests/s with 64 in
                                   flight; one thread drives every GPU
  --json PATH                      write every result as JSON
  --profile PATH                   sample every thread's stacks on CPU time for
                                   the whole run and write them folded to
                                   PATH.<pid> (built with --features profile)
  -q, --quiet                      no progress lines on stderr
  -h, --help                       this text";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Single,
    Threads,
    Processes,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::Threads => "threads",
            Mode::Processes => "processes",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Full,
    Sampled,
    Off,
}

#[derive(Debug, Clone)]
pub struct Opts {
    pub mode: Mode,
    pub gpus: Option<usize>,
    pub ops: Vec<Coll>,
    pub layers: Vec<Layer>,
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub step: usize,
    pub dtype: String,
    pub op: String,
    pub root: usize,
    pub iters: usize,
    pub warmup: usize,
    pub rounds: usize,
    pub min_ms: f64,
    pub nonblocking: bool,
    pub out_of_place: bool,
    pub in_place: bool,
    pub graph: bool,
    pub graph_launches: usize,
    pub check: Check,
    pub cudarc_events: bool,
    pub timeout: Duration,
    pub setup: bool,
    pub setup_reps: usize,
    pub step_phase: bool,
    pub step_raw_mesh: bool,
    pub async_phase: bool,
    pub recover_phase: bool,
    /// `--recover-by-shrink` (`Some(true)`) or `--recover-give-up`
    /// (`Some(false)`).
    pub recover_by_shrink: Option<bool>,
    pub small_phase: bool,
    pub mesh_keeps_world: bool,
    pub fresh_process: bool,
    pub json: Option<PathBuf>,
    /// `--profile`: where the folded stacks go (`profile.rs`).
    pub profile: Option<PathBuf>,
    pub quiet: bool,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            mode: Mode::Threads,
            gpus: None,
            ops: Coll::ALL.to_vec(),
            layers: Layer::ALL.to_vec(),
            min_bytes: 8,
            max_bytes: 2 << 30,
            step: 4,
            dtype: "f32".into(),
            op: "sum".into(),
            root: 0,
            iters: 20,
            warmup: 5,
            rounds: 1,
            min_ms: 0.0,
            nonblocking: false,
            out_of_place: true,
            in_place: true,
            graph: false,
            graph_launches: 10,
            check: Check::Sampled,
            cudarc_events: false,
            timeout: Duration::from_secs(120),
            setup: false,
            setup_reps: 3,
            step_phase: false,
            step_raw_mesh: false,
            async_phase: false,
            recover_phase: false,
            recover_by_shrink: None,
            small_phase: false,
            mesh_keeps_world: false,
            fresh_process: false,
            json: None,
            profile: None,
            quiet: false,
        }
    }
}

/// `8`, `64K`, `128M`, `2G` (powers of 1024).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size (like 8, 64K, 128M, 2G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// The bench's flags, in the declarative table xtask's commands use
/// (`USAGE` says what each does).
const FLAGS: &[Flag] = &[
    value(&["--mode"]),
    value(&["-g", "--gpus"]),
    value(&["--ops"]),
    value(&["--layers"]),
    value(&["-b", "--min-bytes"]),
    value(&["-e", "--max-bytes"]),
    value(&["-f", "--step-factor"]),
    value(&["-d", "--dtype"]),
    value(&["-o", "--op"]),
    value(&["-r", "--root"]),
    value(&["-n", "--iters"]),
    value(&["-w", "--warmup"]),
    value(&["--rounds"]),
    value(&["--min-ms"]),
    switch(&["--nonblocking"]),
    value(&["--in-place"]),
    switch(&["-G", "--graph"]),
    value(&["--graph-launches"]),
    value(&["-c", "--check"]),
    switch(&["--cudarc-events"]),
    value(&["--timeout"]),
    switch(&["--setup"]),
    value(&["--setup-reps"]),
    switch(&["--step"]),
    switch(&["--step-raw-mesh"]),
    switch(&["--async"]),
    switch(&["--recover"]),
    switch(&["--recover-by-shrink"]),
    switch(&["--recover-give-up"]),
    switch(&["--small"]),
    switch(&["--mesh-keeps-world"]),
    switch(&["--fresh-process"]),
    value(&["--json"]),
    value(&["--profile"]),
    switch(&["-q", "--quiet"]),
];

/// The one value of `key` among `choices` (`(spelling, meaning)`), if
/// given.
fn choice<T: Copy>(p: &Parsed<'_>, key: &str, choices: &[(&str, T)]) -> Result<Option<T>, String> {
    let Some(v) = p.value(key) else {
        return Ok(None);
    };
    choices
        .iter()
        .find(|(name, _)| *name == v)
        .map(|(_, t)| Some(*t))
        .ok_or_else(|| format!("{key}: unknown `{v}`"))
}

/// A list flag: `all` or comma-separated names `parse` knows.
fn list<T: Copy>(
    p: &Parsed<'_>,
    key: &str,
    all: &[T],
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<Vec<T>>, String> {
    let Some(text) = p.value(key) else {
        return Ok(None);
    };
    if text == "all" {
        return Ok(Some(all.to_vec()));
    }
    text.split(',')
        .map(|item| parse(item.trim()).ok_or_else(|| format!("{key}: unknown `{item}`")))
        .collect::<Result<Vec<T>, String>>()
        .map(Some)
}

/// A positive, finite number of `what` from `key`, if given.
fn positive(p: &Parsed<'_>, key: &str, what: &str, zero_ok: bool) -> Result<Option<f64>, String> {
    let Some(v) = p.parsed::<f64>(key, what)? else {
        return Ok(None);
    };
    if !v.is_finite() || v < 0.0 || (v == 0.0 && !zero_ok) {
        return Err(format!("{key} takes {what}"));
    }
    Ok(Some(v))
}

/// Parses the flags; `Ok(None)` for `--help`.
pub fn parse(args: &[String]) -> Result<Option<Opts>, String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(None);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = flags::parse("bench", FLAGS, Trailing::None, &args)?;
    let d = Opts::default();
    let size = |key: &str, default: usize| p.value(key).map_or(Ok(default), parse_size);
    let whole = |key: &str, default: usize| {
        p.parsed::<usize>(key, "a whole number")
            .map(|v| v.unwrap_or(default))
    };
    let (out_of_place, in_place) = choice(
        &p,
        "--in-place",
        &[
            ("both", (true, true)),
            ("only", (false, true)),
            ("none", (true, false)),
        ],
    )?
    .unwrap_or((d.out_of_place, d.in_place));
    let o = Opts {
        mode: choice(
            &p,
            "--mode",
            &[
                ("single", Mode::Single),
                ("threads", Mode::Threads),
                ("processes", Mode::Processes),
            ],
        )?
        .unwrap_or(d.mode),
        gpus: p.parsed("-g", "a whole number")?,
        ops: list(&p, "--ops", &Coll::ALL, Coll::parse)?.unwrap_or(d.ops),
        layers: list(&p, "--layers", &Layer::ALL, Layer::parse)?.unwrap_or(d.layers),
        min_bytes: size("-b", d.min_bytes)?,
        max_bytes: size("-e", d.max_bytes)?,
        step: whole("-f", d.step)?,
        dtype: p.value("-d").map_or(d.dtype, str::to_string),
        op: p.value("-o").map_or(d.op, str::to_string),
        root: whole("-r", d.root)?,
        iters: whole("-n", d.iters)?,
        warmup: whole("-w", d.warmup)?,
        rounds: whole("--rounds", d.rounds)?,
        min_ms: positive(&p, "--min-ms", "milliseconds", true)?.unwrap_or(d.min_ms),
        nonblocking: p.has("--nonblocking"),
        out_of_place,
        in_place,
        graph: p.has("-G"),
        graph_launches: whole("--graph-launches", d.graph_launches)?,
        check: choice(
            &p,
            "-c",
            &[
                ("full", Check::Full),
                ("1", Check::Full),
                ("sampled", Check::Sampled),
                ("off", Check::Off),
                ("0", Check::Off),
            ],
        )?
        .unwrap_or(d.check),
        cudarc_events: p.has("--cudarc-events"),
        timeout: match positive(&p, "--timeout", "seconds", false)? {
            Some(secs) => Duration::try_from_secs_f64(secs)
                .map_err(|_| "--timeout takes seconds".to_string())?,
            None => d.timeout,
        },
        setup: p.has("--setup"),
        setup_reps: whole("--setup-reps", d.setup_reps)?,
        step_phase: p.has("--step"),
        step_raw_mesh: p.has("--step-raw-mesh"),
        async_phase: p.has("--async"),
        recover_phase: p.has("--recover"),
        recover_by_shrink: match (p.has("--recover-by-shrink"), p.has("--recover-give-up")) {
            (true, true) => {
                return Err("--recover-by-shrink and --recover-give-up exclude each other".into());
            }
            (true, false) => Some(true),
            (false, true) => Some(false),
            (false, false) => None,
        },
        small_phase: p.has("--small"),
        mesh_keeps_world: p.has("--mesh-keeps-world"),
        fresh_process: p.has("--fresh-process"),
        json: p.value("--json").map(PathBuf::from),
        profile: p.value("--profile").map(PathBuf::from),
        quiet: p.has("-q"),
    };
    if o.min_bytes == 0 || o.min_bytes > o.max_bytes {
        return Err(format!(
            "sizes: need 0 < --min-bytes ({}) <= --max-bytes ({})",
            o.min_bytes, o.max_bytes
        ));
    }
    if o.step < 2 {
        return Err("--step-factor must be at least 2".into());
    }
    if o.iters == 0 || o.rounds == 0 || o.graph_launches == 0 || o.setup_reps == 0 {
        return Err(
            "--iters, --rounds, --graph-launches and --setup-reps must be at least 1".into(),
        );
    }
    let phases = [
        o.setup,
        o.step_phase,
        o.async_phase,
        o.recover_phase,
        o.small_phase,
    ];
    if phases.iter().filter(|&&on| on).count() > 1 {
        return Err("--setup, --step, --async, --recover and --small are separate runs".into());
    }
    if o.step_raw_mesh && !o.step_phase {
        return Err("--step-raw-mesh goes with --step".into());
    }
    if o.step_raw_mesh && o.nonblocking {
        // The mesh's communicators are then nonblocking: raw calls on them
        // would answer ncclInProgress, which the raw side does not poll.
        return Err("--step-raw-mesh needs blocking communicators (not with --nonblocking)".into());
    }
    if o.gpus == Some(0) {
        return Err("--gpus must be at least 1".into());
    }
    Ok(Some(o))
}

/// The sizes of the sweep: min, min*step, ... up to max.
pub fn sizes(o: &Opts) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = o.min_bytes;
    while s <= o.max_bytes {
        out.push(s);
        match s.checked_mul(o.step) {
            Some(next) => s = next,
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Result<Option<Opts>, String> {
        parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    /// Both spellings of a flag, typed values, defaults where a flag is
    /// absent, and typed refusals.
    #[test]
    fn flags_read_from_the_table_with_their_aliases() {
        let o = opts(&["--mode", "single", "-b", "1K", "--max-bytes", "2M", "-G"])
            .unwrap()
            .unwrap();
        assert_eq!(o.mode, Mode::Single);
        assert_eq!((o.min_bytes, o.max_bytes), (1024, 2 << 20));
        assert!(o.graph && !o.setup);
        assert_eq!(o.iters, Opts::default().iters);
        let o = opts(&[
            "--in-place",
            "only",
            "-c",
            "off",
            "--timeout",
            "2.5",
            "--ops",
            "all_reduce",
        ])
        .unwrap()
        .unwrap();
        assert!(o.in_place && !o.out_of_place);
        assert_eq!(o.check, Check::Off);
        assert_eq!(o.timeout, Duration::from_millis(2500));
        assert_eq!(o.ops.len(), 1);
        assert!(opts(&["--help"]).unwrap().is_none());
        for bad in [
            &["--bogus"][..],
            &["-n"],
            &["-n", "x"],
            &["--timeout", "0"],
            &["--mode", "both"],
            &["--ops", "all_reduce,nope"],
            &["--setup", "--step"],
            &["--step-raw-mesh"],
            &["--step", "--step-raw-mesh", "--nonblocking"],
        ] {
            assert!(opts(bad).is_err(), "{bad:?}");
        }
    }
}
