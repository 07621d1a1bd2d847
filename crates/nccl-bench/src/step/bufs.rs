//! The step's buffers: how many elements each holds ([`Layout`]), one
//! side's device buffers ([`Bufs`]), their inputs and their outputs copied
//! back.

use std::sync::Arc;

use half::bf16;
use nccl_dist::nccl_safe::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use serde_json::{Value, json};

use crate::error::Result;

/// Elements of each buffer at `dp` ranks along dp.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub dp: usize,
    pub tp: usize,
    pub bcast: usize,
    pub tp_sum: usize,
    /// all_to_all elements per peer.
    pub a2a: usize,
    /// reduce_scatter output (all_gather input) elements.
    pub shard: usize,
    pub ring: usize,
    pub avg: usize,
    pub loss: usize,
}

impl Layout {
    pub fn new(dp: usize, tp: usize) -> Layout {
        Layout {
            dp,
            tp,
            bcast: 2,
            tp_sum: 32 << 10,
            a2a: (8 << 10) / dp,
            shard: (512 << 10) / dp,
            ring: 1 << 10,
            avg: 64 << 10,
            loss: 2,
        }
    }

    /// The table of the module docs, for the JSON.
    pub fn describe(&self) -> Value {
        let op = |n: usize, name: &str, axis: &str, dtype: &str, bytes: usize, call: &str| json!({"n": n, "op": name, "axis": axis, "dtype": dtype, "bytes": bytes, "nccl": call});
        json!([
            op(
                1,
                "broadcast in place, root 0",
                "tp",
                "f32",
                self.bcast * 4,
                "ncclBroadcast"
            ),
            op(
                2,
                "all_reduce sum",
                "tp",
                "bf16",
                self.tp_sum * 2,
                "ncclAllReduce"
            ),
            op(
                3,
                "all_to_all",
                "dp",
                "bf16",
                self.a2a * self.dp * 2,
                "ncclAlltoAll"
            ),
            op(
                4,
                "reduce_scatter sum",
                "dp",
                "bf16",
                self.shard * self.dp * 2,
                "ncclReduceScatter"
            ),
            op(
                5,
                "all_gather",
                "dp",
                "bf16",
                self.shard * self.dp * 2,
                "ncclAllGather"
            ),
            op(
                6,
                "ring send+recv, one group",
                "dp",
                "f32",
                self.ring * 4,
                "ncclSend+ncclRecv"
            ),
            op(
                7,
                "all_reduce PreMulSum(1/dp)",
                "dp",
                "f32",
                self.avg * 4,
                "ncclAllReduce"
            ),
            op(
                8,
                "all_reduce sum",
                "dp",
                "f32",
                self.loss * 4,
                "ncclAllReduce"
            ),
        ])
    }
}

/// The value of element `i` of input buffer `buf` on world rank `rank`.
pub fn value(rank: usize, buf: usize, i: usize) -> f64 {
    (1 + (rank * 7 + buf * 3 + i) % 5) as f64
}

// Input buffer numbers, for `value`.
pub const B_BCAST: usize = 0;
pub const B_TP: usize = 1;
pub const B_A2A: usize = 2;
pub const B_GRAD: usize = 3;
pub const B_RING: usize = 4;
pub const B_AVG: usize = 5;
pub const B_LOSS: usize = 6;

/// One side's buffers on one rank.
pub struct Bufs {
    pub bcast: CudaSlice<f32>,
    pub tp_in: CudaSlice<bf16>,
    pub tp_out: CudaSlice<bf16>,
    pub a2a_in: CudaSlice<bf16>,
    pub a2a_out: CudaSlice<bf16>,
    pub grad: CudaSlice<bf16>,
    pub shard: CudaSlice<bf16>,
    pub full: CudaSlice<bf16>,
    pub ring_send: CudaSlice<f32>,
    pub ring_recv: CudaSlice<f32>,
    pub avg_in: CudaSlice<f32>,
    pub avg_out: CudaSlice<f32>,
    pub loss_in: CudaSlice<f32>,
    pub loss_out: CudaSlice<f32>,
}

fn host<T: Copy>(len: usize, f: impl Fn(usize) -> f64, from: impl Fn(f64) -> T) -> Vec<T> {
    (0..len).map(|i| from(f(i))).collect()
}

impl Bufs {
    pub fn new(s: &Arc<CudaStream>, l: &Layout) -> Result<Bufs> {
        let z16 = |n: usize| s.alloc_zeros::<bf16>(n);
        let z32 = |n: usize| s.alloc_zeros::<f32>(n);
        Ok(Bufs {
            bcast: z32(l.bcast)?,
            tp_in: z16(l.tp_sum)?,
            tp_out: z16(l.tp_sum)?,
            a2a_in: z16(l.a2a * l.dp)?,
            a2a_out: z16(l.a2a * l.dp)?,
            grad: z16(l.shard * l.dp)?,
            shard: z16(l.shard)?,
            full: z16(l.shard * l.dp)?,
            ring_send: z32(l.ring)?,
            ring_recv: z32(l.ring)?,
            avg_in: z32(l.avg)?,
            avg_out: z32(l.avg)?,
            loss_in: z32(l.loss)?,
            loss_out: z32(l.loss)?,
        })
    }

    /// Fresh inputs for world rank `me`, zeroed outputs; waits for it.
    pub fn reset(&mut self, s: &Arc<CudaStream>, l: &Layout, me: usize) -> Result<()> {
        let b16 = bf16::from_f64;
        let f = |v: f64| v as f32;
        s.memcpy_htod(
            &host(l.bcast, |i| value(me, B_BCAST, i), f),
            &mut self.bcast,
        )?;
        s.memcpy_htod(
            &host(l.tp_sum, |i| value(me, B_TP, i), b16),
            &mut self.tp_in,
        )?;
        let a2a = l.a2a * l.dp;
        s.memcpy_htod(&host(a2a, |i| value(me, B_A2A, i), b16), &mut self.a2a_in)?;
        let grad = l.shard * l.dp;
        s.memcpy_htod(&host(grad, |i| value(me, B_GRAD, i), b16), &mut self.grad)?;
        s.memcpy_htod(
            &host(l.ring, |i| value(me, B_RING, i), f),
            &mut self.ring_send,
        )?;
        s.memcpy_htod(&host(l.avg, |i| value(me, B_AVG, i), f), &mut self.avg_in)?;
        s.memcpy_htod(
            &host(l.loss, |i| value(me, B_LOSS, i), f),
            &mut self.loss_in,
        )?;
        s.memset_zeros(&mut self.tp_out)?;
        s.memset_zeros(&mut self.a2a_out)?;
        s.memset_zeros(&mut self.shard)?;
        s.memset_zeros(&mut self.full)?;
        s.memset_zeros(&mut self.ring_recv)?;
        s.memset_zeros(&mut self.avg_out)?;
        s.memset_zeros(&mut self.loss_out)?;
        s.synchronize()?;
        Ok(())
    }

    /// Every output copied back, in step order, as (name, values in f64,
    /// bit patterns).
    pub fn outputs(&self, s: &Arc<CudaStream>) -> Result<Vec<Output>> {
        fn out<T: DeviceRepr + Copy>(
            s: &Arc<CudaStream>,
            name: &'static str,
            b: &CudaSlice<T>,
            conv: impl Fn(T) -> (f64, u32),
        ) -> Result<Output> {
            let (values, bits) = s.clone_dtoh(b)?.into_iter().map(conv).unzip();
            Ok(Output { name, values, bits })
        }
        let h = |v: bf16| (f64::from(v), u32::from(v.to_bits()));
        let f = |v: f32| (f64::from(v), v.to_bits());
        Ok(vec![
            out(s, "broadcast", &self.bcast, f)?,
            out(s, "all_reduce_tp", &self.tp_out, h)?,
            out(s, "all_to_all", &self.a2a_out, h)?,
            out(s, "reduce_scatter", &self.shard, h)?,
            out(s, "all_gather", &self.full, h)?,
            out(s, "ring_recv", &self.ring_recv, f)?,
            out(s, "premul_avg", &self.avg_out, f)?,
            out(s, "loss", &self.loss_out, f)?,
        ])
    }
}

/// One output copied back: its name, values in f64 and bit patterns.
pub struct Output {
    pub name: &'static str,
    pub values: Vec<f64>,
    pub bits: Vec<u32>,
}
