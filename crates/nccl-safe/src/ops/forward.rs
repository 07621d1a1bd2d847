//! The list of collectives that other types forward ([`for_each_collective!`](crate::for_each_collective)),
//! and its first use: `Comm`'s direct forms on its own stream.
//!
//! Adding a collective is its constructor on [`OnStream`] and one line
//! here; `Comm` and nccl-dist's `DeviceMesh` expand the list.

use cudarc::driver::CudaStream;

use crate::comm::Comm;
use crate::ops::OnStream;

/// Calls `$callback!` with every collective [`OnStream`] has, one entry
/// each: `name [generics] (parameters);` (with `#[...]` attributes to put
/// on a forwarder), in the `'a` of the buffers' borrow. Paths are
/// absolute, so the callback may expand in another crate.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_collective {
    ($callback:ident) => {
        $callback! {
            all_reduce [T: $crate::NcclType] (send: &'a (impl $crate::DeviceBuffer<T> + ?Sized), recv: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), op: impl $crate::Reduction<'a, T>);
            all_reduce_in_place [T: $crate::NcclType] (buf: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), op: impl $crate::Reduction<'a, T>);
            reduce [T: $crate::NcclType, R: $crate::DeviceBufferMut<T> + ?Sized] (send: &'a (impl $crate::DeviceBuffer<T> + ?Sized), recv: Option<&'a mut R>, op: impl $crate::Reduction<'a, T>, root: usize);
            reduce_in_place [T: $crate::NcclType] (buf: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), op: impl $crate::Reduction<'a, T>, root: usize);
            reduce_scatter [T: $crate::NcclType] (send: &'a (impl $crate::DeviceBuffer<T> + ?Sized), recv: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), op: impl $crate::Reduction<'a, T>);
            reduce_scatter_in_place [T: $crate::NcclType] (buf: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), op: impl $crate::Reduction<'a, T>);
            broadcast [T: $crate::NcclType, S: $crate::DeviceBuffer<T> + ?Sized] (send: Option<&'a S>, recv: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), root: usize);
            broadcast_in_place [T: $crate::NcclType] (buf: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), root: usize);
            all_gather [T: $crate::NcclType] (send: &'a (impl $crate::DeviceBuffer<T> + ?Sized), recv: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized));
            all_gather_in_place [T: $crate::NcclType] (buf: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized));
            all_to_all [T: $crate::NcclType] (send: &'a (impl $crate::DeviceBuffer<T> + ?Sized), recv: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized));
            #[allow(clippy::too_many_arguments)]
            all_to_all_v [T: $crate::NcclType] (send: &'a (impl $crate::DeviceBuffer<T> + ?Sized), send_counts: &[usize], send_displs: &[usize], recv: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), recv_counts: &[usize], recv_displs: &[usize]);
            gather [T: $crate::NcclType, R: $crate::DeviceBufferMut<T> + ?Sized] (send: &'a (impl $crate::DeviceBuffer<T> + ?Sized), recv: Option<&'a mut R>, root: usize);
            gather_in_place [T: $crate::NcclType] (buf: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), root: usize);
            scatter [T: $crate::NcclType, S: $crate::DeviceBuffer<T> + ?Sized] (send: Option<&'a S>, recv: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), root: usize);
            scatter_in_place [T: $crate::NcclType] (buf: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), root: usize);
            send [T: $crate::NcclType] (buf: &'a (impl $crate::DeviceBuffer<T> + ?Sized), peer: usize);
            recv [T: $crate::NcclType] (buf: &'a mut (impl $crate::DeviceBufferMut<T> + ?Sized), peer: usize);
        }
    };
}

/// `Comm`'s forwarders: each collective on the communicator's own stream.
macro_rules! comm_forwarders {
    ($( $(#[$attr:meta])* $name:ident [$($generics:tt)*] ($($arg:ident : $ty:ty),*); )*) => {
        /// Direct forms on the communicator's own stream (outside groups).
        impl Comm {
            $(
                #[doc = concat!("See [`OnStream::", stringify!($name), "`].")]
                $(#[$attr])*
                pub fn $name<'a, $($generics)*>(&'a self, $($arg: $ty),*) -> $crate::Result<()> {
                    self.own().$name($($arg),*)
                }
            )*
        }
    };
}

crate::for_each_collective!(comm_forwarders);

impl Comm {
    /// Operations on `stream` instead of the communicator's own.
    pub fn on<'a>(&'a self, stream: &'a CudaStream) -> OnStream<'a, 'a> {
        OnStream::direct(self, stream)
    }

    fn own(&self) -> OnStream<'_, '_> {
        OnStream::direct(self, self.stream())
    }
}
