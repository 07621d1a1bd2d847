//! NCCL's group state belongs to the thread that opened the group: the
//! guard cannot be ended on another thread.

use nccl_safe::GroupGuard;

fn main() {
    let group = GroupGuard::start().unwrap();
    let ended = std::thread::spawn(move || group.end());
    let _ = ended.join();
}
