//! The direct forms on a communicator's own stream.

use cudarc::driver::CudaStream;

use crate::Result;
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::comm::Comm;
use crate::dtype::NcclType;
use crate::ops::OnStream;
use crate::reduce_op::Reduction;

/// Direct forms on the communicator's own stream (outside groups).
impl Comm {
    /// Operations on `stream` instead of the communicator's own.
    pub fn on<'a>(&'a self, stream: &'a CudaStream) -> OnStream<'a, 'a> {
        OnStream::direct(self, stream)
    }

    fn own(&self) -> OnStream<'_, '_> {
        OnStream::direct(self, self.stream())
    }

    /// See [`OnStream::all_reduce`].
    pub fn all_reduce<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        self.own().all_reduce(send, recv, op)
    }

    /// See [`OnStream::all_reduce_in_place`].
    pub fn all_reduce_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        self.own().all_reduce_in_place(buf, op)
    }

    /// See [`OnStream::reduce`].
    pub fn reduce<'a, T: NcclType, R: DeviceBufferMut<T> + ?Sized>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: Option<&'a mut R>,
        op: impl Reduction<'a, T>,
        root: usize,
    ) -> Result<()> {
        self.own().reduce(send, recv, op, root)
    }

    /// See [`OnStream::reduce_in_place`].
    pub fn reduce_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
        root: usize,
    ) -> Result<()> {
        self.own().reduce_in_place(buf, op, root)
    }

    /// See [`OnStream::reduce_scatter`].
    pub fn reduce_scatter<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        self.own().reduce_scatter(send, recv, op)
    }

    /// See [`OnStream::reduce_scatter_in_place`].
    pub fn reduce_scatter_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        self.own().reduce_scatter_in_place(buf, op)
    }

    /// See [`OnStream::broadcast`].
    pub fn broadcast<'a, T: NcclType, S: DeviceBuffer<T> + ?Sized>(
        &'a self,
        send: Option<&'a S>,
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().broadcast(send, recv, root)
    }

    /// See [`OnStream::broadcast_in_place`].
    pub fn broadcast_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().broadcast_in_place(buf, root)
    }

    /// See [`OnStream::all_gather`].
    pub fn all_gather<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        self.own().all_gather(send, recv)
    }

    /// See [`OnStream::all_gather_in_place`].
    pub fn all_gather_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        self.own().all_gather_in_place(buf)
    }

    /// See [`OnStream::all_to_all`].
    pub fn all_to_all<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        self.own().all_to_all(send, recv)
    }

    /// See [`OnStream::all_to_all_v`].
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        self.own().all_to_all_v(
            send,
            send_counts,
            send_displs,
            recv,
            recv_counts,
            recv_displs,
        )
    }

    /// See [`OnStream::gather`].
    pub fn gather<'a, T: NcclType, R: DeviceBufferMut<T> + ?Sized>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: Option<&'a mut R>,
        root: usize,
    ) -> Result<()> {
        self.own().gather(send, recv, root)
    }

    /// See [`OnStream::gather_in_place`].
    pub fn gather_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().gather_in_place(buf, root)
    }

    /// See [`OnStream::scatter_in_place`].
    pub fn scatter_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().scatter_in_place(buf, root)
    }

    /// See [`OnStream::scatter`].
    pub fn scatter<'a, T: NcclType, S: DeviceBuffer<T> + ?Sized>(
        &'a self,
        send: Option<&'a S>,
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().scatter(send, recv, root)
    }

    /// See [`OnStream::send`].
    pub fn send<'a, T: NcclType>(
        &'a self,
        buf: &'a (impl DeviceBuffer<T> + ?Sized),
        peer: usize,
    ) -> Result<()> {
        self.own().send(buf, peer)
    }

    /// See [`OnStream::recv`].
    pub fn recv<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        peer: usize,
    ) -> Result<()> {
        self.own().recv(buf, peer)
    }
}
