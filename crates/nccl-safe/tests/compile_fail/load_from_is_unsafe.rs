//! Loading a library runs its initialisers: naming the file is the
//! caller's promise, made in an `unsafe` block.

fn main() {
    let _ = nccl_safe::Library::load_from("/tmp/libnccl.so.2");
}
