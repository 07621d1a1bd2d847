//! Command-line flags of the bench, parsed by hand (nccl-tests' spellings
//! where they have one).

use std::path::PathBuf;
use std::time::Duration;

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
  --layers LIST                    raw,safe,dist,safe_wd or `all` (raw,safe,dist) [all]:
                                   raw calls nccl-sys directly and safe the typed
                                   nccl-safe API, both on a blocking communicator
                                   without watchdog; dist nccl-dist's `dyn
                                   Communicator` on the world made with default
                                   options (not in single mode); safe_wd is safe
                                   with a watchdog observing the same communicator
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
  --setup-reps N                   set-up repetitions (the first is cold) [3]
  --step                           time a training-like step over a 2-D DeviceMesh
                                   (dp x tp) with default options against the same
                                   step in raw nccl-sys calls, interleaved (-n steps
                                   per measurement, -w warm-up steps, --rounds);
                                   threads or processes mode
  --async                          time awaiting an 8 B all_reduce (Completion)
                                   against a blocking stream sync, the waker
                                   thread's CPU share, and requests/s with 64 in
                                   flight; one thread drives every GPU
  --json PATH                      write every result as JSON
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
    pub async_phase: bool,
    pub json: Option<PathBuf>,
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
            async_phase: false,
            json: None,
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

fn number(flag: &str, text: &str) -> Result<usize, String> {
    text.parse()
        .map_err(|_| format!("{flag} wants a whole number, not `{text}`"))
}

fn list<T: Copy>(
    flag: &str,
    text: &str,
    all: &[T],
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    if text == "all" {
        return Ok(all.to_vec());
    }
    text.split(',')
        .map(|item| parse(item.trim()).ok_or_else(|| format!("{flag}: unknown `{item}`")))
        .collect()
}

/// Parses the flags; `Ok(None)` for `--help`.
pub fn parse(args: &[String]) -> Result<Option<Opts>, String> {
    let mut o = Opts::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .map(String::as_str)
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--mode" => {
                o.mode = match value()? {
                    "single" => Mode::Single,
                    "threads" => Mode::Threads,
                    "processes" => Mode::Processes,
                    other => return Err(format!("--mode: unknown `{other}`")),
                }
            }
            "-g" | "--gpus" => o.gpus = Some(number(flag, value()?)?),
            "--ops" => o.ops = list(flag, value()?, &Coll::ALL, Coll::parse)?,
            "--layers" => o.layers = list(flag, value()?, &Layer::ALL, Layer::parse)?,
            "-b" | "--min-bytes" => o.min_bytes = parse_size(value()?)?,
            "-e" | "--max-bytes" => o.max_bytes = parse_size(value()?)?,
            "-f" | "--step-factor" => o.step = number(flag, value()?)?,
            "-d" | "--dtype" => o.dtype = value()?.to_string(),
            "-o" | "--op" => o.op = value()?.to_string(),
            "-r" | "--root" => o.root = number(flag, value()?)?,
            "-n" | "--iters" => o.iters = number(flag, value()?)?,
            "-w" | "--warmup" => o.warmup = number(flag, value()?)?,
            "--rounds" => o.rounds = number(flag, value()?)?,
            "--min-ms" => {
                o.min_ms = value()?
                    .parse()
                    .ok()
                    .filter(|ms: &f64| *ms >= 0.0 && ms.is_finite())
                    .ok_or("--min-ms wants milliseconds")?
            }
            "--nonblocking" => o.nonblocking = true,
            "--in-place" => {
                (o.out_of_place, o.in_place) = match value()? {
                    "both" => (true, true),
                    "only" => (false, true),
                    "none" => (true, false),
                    other => return Err(format!("--in-place: unknown `{other}`")),
                }
            }
            "-G" | "--graph" => o.graph = true,
            "--graph-launches" => o.graph_launches = number(flag, value()?)?,
            "-c" | "--check" => {
                o.check = match value()? {
                    "full" | "1" => Check::Full,
                    "sampled" => Check::Sampled,
                    "off" | "0" => Check::Off,
                    other => return Err(format!("--check: unknown `{other}`")),
                }
            }
            "--cudarc-events" => o.cudarc_events = true,
            "--timeout" => {
                let secs: f64 = value()?
                    .parse()
                    .map_err(|_| "--timeout wants seconds".to_string())?;
                if !(secs > 0.0 && secs.is_finite()) {
                    return Err("--timeout must be positive".into());
                }
                o.timeout = Duration::from_secs_f64(secs);
            }
            "--setup" => o.setup = true,
            "--setup-reps" => o.setup_reps = number(flag, value()?)?,
            "--step" => o.step_phase = true,
            "--async" => o.async_phase = true,
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "-q" | "--quiet" => o.quiet = true,
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
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
    if o.setup && o.step_phase {
        return Err("--setup and --step are separate runs".into());
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
