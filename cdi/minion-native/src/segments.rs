//! Shared-memory segments and the pool that keeps them warm (`cdi/minion/segments.py`).
//!
//! A segment is a memfd (shared memory no process can map unless handed the fd) whose pages
//! are allocated up front with posix_fallocate: first touch of fresh pages costs far more than
//! pages already in use, so released segments go back to a pool by size class
//! and a `create` of a size seen before never allocates again.
//!
//! Cooperative segments are sealed against shrinking and growing, so the minion's own mapping
//! of them can never fault. Strict segments stay unsealed because revoking one *is* truncating
//! it; their owner holds the fd and may truncate it too, so the minion never touches their
//! bytes through its mapping: it copies out of them with pread and zeroes them with pwrite,
//! which see a truncated file as a short one instead of killing the process with SIGBUS.
//!
//! A minion with a state folder (`--state-dir`, `journal.rs`) keeps its segments as files in a
//! folder of its own under /dev/shm instead, so that they outlive its process. Such files
//! cannot be sealed: every one of them is treated like a strict segment as far as the minion's
//! own access goes (pread and pwrite only), while cooperative ones still go back to the pool.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use crate::protocol::{size_class, CdiError, Failure};
use crate::sys;

/// A handful of uids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UidSet(Vec<u32>);

impl UidSet {
    pub fn of(uid: u32) -> Self {
        UidSet(vec![uid])
    }

    pub fn from_list(uids: &[u32]) -> Self {
        let mut set = UidSet::default();
        for &uid in uids {
            set.add(uid);
        }
        set
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }

    pub fn add(&mut self, uid: u32) {
        if !self.0.contains(&uid) {
            self.0.push(uid);
        }
    }

    pub fn contains(&self, uid: u32) -> bool {
        self.0.contains(&uid)
    }

    /// Whether no uid but `uid` is in the set.
    pub fn within(&self, uid: u32) -> bool {
        self.0.iter().all(|&u| u == uid)
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn only(&self) -> Option<u32> {
        self.0.first().copied()
    }
}

/// One memfd (or file under /dev/shm) plus the minion's own mapping of it.
#[derive(Debug)]
pub struct Segment {
    pub fd: RawFd,
    pub capacity: u64,
    /// The kernel keeps its size: the minion may touch it through its own mapping.
    pub sealed: bool,
    /// A cooperative segment: it goes back to the pool when its object is gone.
    pub poolable: bool,
    /// Where the file of a segment that outlives the minion is (unlinked when it is freed).
    pub path: Option<PathBuf>,
    addr: *mut u8,
    /// Unique for the minion's life: a client that cached a mapping names the memory by it.
    pub id: u64,
    /// Bytes from the start that earlier objects may have written (the rest is zeros).
    dirty: u64,
    /// Every uid whose processes were ever handed this memory (as owners or readers). Only a
    /// segment of one uid goes back to the pool, and only to that uid: Linux cannot take back
    /// a mapping, so memory one uid may still map never serves another.
    pub uids: UidSet,
    /// A read-only descriptor of the same memory, opened on a reader's first grant.
    read_only: Option<RawFd>,
}

impl Segment {
    fn allocate(
        capacity: u64,
        poolable: bool,
        id: u64,
        dir: Option<&Path>,
    ) -> Result<Segment, Failure> {
        let path = dir.map(|dir| segment_path(dir, id));
        let sealed = poolable && path.is_none();
        let fd = match &path {
            Some(path) => {
                let name = sys::c_path(path)?;
                // SAFETY: name is NUL-terminated; O_EXCL: never another's file.
                unsafe {
                    libc::open(
                        name.as_ptr(),
                        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                        0o600,
                    )
                }
            }
            None => {
                let mut flags = libc::MFD_CLOEXEC;
                if sealed {
                    flags |= libc::MFD_ALLOW_SEALING;
                }
                // SAFETY: the name is a NUL-terminated literal.
                unsafe { libc::memfd_create(c"cdi-segment".as_ptr(), flags) }
            }
        };
        if fd < 0 {
            // No memfd at all (a descriptor limit), not a shortage of pages: an internal error.
            return Err(Failure::Internal(sys::last_os_error_text()));
        }
        match Self::prepare(fd, capacity, sealed) {
            Ok(addr) => Ok(Segment {
                fd,
                capacity,
                sealed,
                poolable,
                path,
                addr,
                id,
                dirty: 0,
                uids: UidSet::default(),
                read_only: None,
            }),
            Err(code) => {
                sys::close(fd);
                if let Some(path) = &path {
                    let _ = std::fs::remove_file(path);
                }
                Err(CdiError::out_of_memory(format!(
                    "cannot allocate a {capacity}-byte segment: {}",
                    sys::os_error_text(code)
                ))
                .into())
            }
        }
    }

    /// The segment file `id` of a minion that went before, as it left it: `None` if it is not
    /// there (the host rebooted) or cannot be mapped.
    pub fn reopen(dir: &Path, id: u64, capacity: u64, poolable: bool) -> Option<Segment> {
        let path = segment_path(dir, id);
        let name = sys::c_path(&path).ok()?;
        // SAFETY: name is NUL-terminated.
        let fd = unsafe { libc::open(name.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        let length = capacity as usize;
        // SAFETY: a fresh shared mapping of an fd we hold; the minion touches unsealed
        // segments only with pread and pwrite, so a short file cannot fault it.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            sys::close(fd);
            return None;
        }
        Some(Segment {
            fd,
            capacity,
            sealed: false,
            poolable,
            path: Some(path),
            addr: addr.cast(),
            id,
            dirty: capacity,
            uids: UidSet::default(),
            read_only: None,
        })
    }

    /// Size the memfd, allocate its pages now (not on first touch), seal, map; an errno if not.
    fn prepare(fd: RawFd, capacity: u64, sealed: bool) -> Result<*mut u8, i32> {
        let length = libc::off_t::try_from(capacity).map_err(|_| libc::EFBIG)?;
        // SAFETY: fd is the memfd just created; the calls take plain integers.
        unsafe {
            // Only the minion's uid may open the memory by name (/proc/<pid>/fd/<n>): a reader
            // given a read-only fd cannot reopen it writable through /proc/self/fd.
            if libc::fchmod(fd, 0o600) != 0 || libc::ftruncate(fd, length) != 0 {
                return Err(sys::errno());
            }
            loop {
                match libc::posix_fallocate(fd, 0, length) {
                    0 => break,
                    libc::EINTR => continue, // a signal (SIGTERM) while allocating a big one
                    code => return Err(code),
                }
            }
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if sealed && libc::fcntl(fd, libc::F_ADD_SEALS, seals) != 0 {
                return Err(sys::errno());
            }
            let addr = libc::mmap(
                std::ptr::null_mut(),
                capacity as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if addr == libc::MAP_FAILED {
                return Err(sys::errno());
            }
            Ok(addr.cast())
        }
    }

    /// A read-only fd of this memory for readers of a shared object: it cannot be mapped
    /// writable (EACCES), written or truncated. Opened once, through /proc/self/fd, and kept.
    pub fn read_only_fd(&mut self) -> Result<RawFd, Failure> {
        if let Some(fd) = self.read_only {
            return Ok(fd);
        }
        let path = format!("/proc/self/fd/{}\0", self.fd);
        // SAFETY: path is NUL-terminated.
        let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(Failure::Internal(format!(
                "cannot open a read-only descriptor of segment {}: {}",
                self.id,
                sys::last_os_error_text()
            )));
        }
        self.read_only = Some(fd);
        Ok(fd)
    }

    /// True if the file still spans `length` bytes (an unsealed owner may have shrunk it).
    pub fn intact(&self, length: u64) -> bool {
        self.sealed || self.file_size() >= length
    }

    fn file_size(&self) -> u64 {
        // SAFETY: st is a valid out-pointer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(self.fd, &mut st) } != 0 {
            return 0;
        }
        st.st_size.max(0) as u64
    }

    /// Zero bytes `start..end` (clipped to the capacity).
    pub fn zero(&mut self, end: u64, start: u64) {
        let end = end.min(self.capacity);
        if end <= start {
            return;
        }
        if self.sealed {
            // SAFETY: start..end lies within the mapping, and a sealed file cannot shrink
            // under it, so every page is there.
            unsafe {
                std::ptr::write_bytes(self.addr.add(start as usize), 0, (end - start) as usize)
            };
            return;
        }
        static ZEROS: [u8; 65536] = [0; 65536];
        let mut at = start;
        while at < end {
            let n = (end - at).min(ZEROS.len() as u64) as usize;
            // SAFETY: ZEROS is valid for n bytes; pwrite reads it and writes the file.
            let written =
                unsafe { libc::pwrite(self.fd, ZEROS.as_ptr().cast(), n, at as libc::off_t) };
            if written <= 0 {
                if written < 0 && sys::errno() == libc::EINTR {
                    continue;
                }
                break;
            }
            at += written as u64;
        }
    }

    /// Write `data` at `offset` (clipped to the capacity), into a segment nobody else maps
    /// yet: the gateway fills an object before it exists.
    pub fn write_at(&mut self, offset: u64, data: &[u8]) {
        let n = (data.len() as u64).min(self.capacity.saturating_sub(offset)) as usize;
        // SAFETY: offset + n lies within our mapping, which nobody else can truncate yet.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.addr.add(offset as usize), n) };
    }

    /// Receive at most `length` bytes from the socket `sock` into this segment at `offset`,
    /// without blocking (as `write_at`); recv's result.
    pub fn receive_from(&mut self, sock: RawFd, offset: u64, length: u64) -> isize {
        let n = length.min(self.capacity.saturating_sub(offset)) as usize;
        // SAFETY: as in write_at; recv writes at most n bytes.
        unsafe {
            libc::recv(
                sock,
                self.addr.add(offset as usize).cast(),
                n,
                libc::MSG_DONTWAIT,
            )
        }
    }

    /// Send, without blocking, what is left of `head` followed by this segment's first `length`
    /// bytes, `sent` bytes of the two being out already (one `sendmsg`, no copy); its result.
    pub fn send_with(&self, sock: RawFd, head: &[u8], sent: u64, length: u64) -> isize {
        let length = length.min(self.capacity);
        let skip = (sent as usize).min(head.len());
        let from = sent.saturating_sub(head.len() as u64).min(length);
        let mut parts = [
            libc::iovec {
                iov_base: head[skip..].as_ptr() as *mut libc::c_void,
                iov_len: head.len() - skip,
            },
            libc::iovec {
                // SAFETY: from <= length <= capacity: within our mapping.
                iov_base: unsafe { self.addr.add(from as usize) }.cast(),
                iov_len: (length - from) as usize,
            },
        ];
        let first = usize::from(parts[0].iov_len == 0);
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = parts[first..].as_mut_ptr();
        msg.msg_iovlen = 2 - first;
        // SAFETY: the iovecs point into `head` and our mapping, valid for their lengths.
        unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) }
    }

    /// Copy the first `length` bytes of `other` into this segment, which nobody else maps yet.
    pub fn copy_from(&mut self, other: &Segment, length: u64) {
        let n = length.min(self.capacity).min(other.capacity) as usize;
        if other.sealed {
            // SAFETY: both ranges lie within their mappings; a sealed source cannot shrink,
            // and this segment was just acquired, so no owner can truncate it.
            unsafe { std::ptr::copy(other.addr, self.addr, n) };
            return;
        }
        let mut done = 0usize;
        while done < n {
            // SAFETY: self.addr + done .. + (n - done) lies within our mapping, which is
            // intact (see above); pread stops short at the source file's end.
            let got = unsafe {
                libc::pread(
                    other.fd,
                    self.addr.add(done).cast(),
                    n - done,
                    done as libc::off_t,
                )
            };
            if got <= 0 {
                if got < 0 && sys::errno() == libc::EINTR {
                    continue;
                }
                break;
            }
            done += got as usize;
        }
    }

    /// Unmap and close; `truncate` first frees the pages so every stale mapping faults.
    fn close(self, truncate: bool) {
        if truncate && !self.sealed {
            // SAFETY: fd is ours; truncating to 0 has no other precondition.
            unsafe { libc::ftruncate(self.fd, 0) };
        }
        drop(self);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: addr/capacity are the mapping made in allocate and fd the memfd; both are
        // released exactly once, here.
        unsafe { libc::munmap(self.addr.cast(), self.capacity as usize) };
        sys::close(self.fd);
        if let Some(fd) = self.read_only {
            sys::close(fd);
        }
        if let Some(path) = &self.path {
            // The memory goes once every mapping of it does, as a memfd's would.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Hands out segments by size class and keeps released ones warm for reuse, per uid.
///
/// `memory_limit` caps all segment bytes (in use and idle); `idle_limit` caps what idle
/// segments keep. A released segment that one uid alone was handed is kept for that uid only;
/// one handed to several uids is closed (a process may still map it: Linux cannot revoke a
/// mapping, so its pages must never hold another object). A segment is zeroed when it is
/// handed out again, as far as it must be: all of it if the new owner asked for zeros, else the
/// old bytes beyond the new object's size. The rest are its own uid's bytes, which a process of
/// that uid could read anyway (/proc/<pid>/mem).
pub struct SegmentPool {
    pub memory_limit: u64,
    idle_limit: u64,
    page: u64,
    idle: BTreeMap<(u64, bool, Option<u32>), Vec<Segment>>,
    pub next_id: u64,
    /// Where segments that outlive the minion are kept (a state folder's); None: memfds.
    pub dir: Option<PathBuf>,
    pub idle_bytes: u64,
    pub used_bytes: u64,
    pub used_segments: u64,
    pub allocations: u64,
    pub reuses: u64,
    pub zeroed_bytes: u64,
    /// Released segments closed because several uids were handed them.
    pub retired: u64,
}

impl SegmentPool {
    pub fn new(memory_limit: u64, idle_limit: u64, page: u64) -> Self {
        SegmentPool {
            memory_limit,
            idle_limit,
            page,
            idle: BTreeMap::new(),
            next_id: 1,
            dir: None,
            idle_bytes: 0,
            used_bytes: 0,
            used_segments: 0,
            allocations: 0,
            reuses: 0,
            zeroed_bytes: 0,
            retired: 0,
        }
    }

    /// A segment for `size` bytes, to be handed to a process of `uid`: an idle one of its class
    /// that only `uid` (or nobody) was handed, if any (one of `prefer`, segment ids the caller
    /// still maps, when possible), else a new one. `zeroed=false`: that process overwrites the
    /// first `size` bytes, so its own old bytes may stay there (never beyond `size`).
    pub fn acquire(
        &mut self,
        size: u64,
        sealed: bool,
        prefer: &[i128],
        uid: Option<u32>,
        zeroed: bool,
    ) -> Result<Segment, Failure> {
        let class = size_class(size, self.page);
        let mut reused = None;
        if let Ok(capacity) = u64::try_from(class) {
            for owner in [uid, None] {
                if let Some(bucket) = self.idle.get_mut(&(capacity, sealed, owner)) {
                    if !bucket.is_empty() {
                        reused = Some(bucket.remove(preferred_index(bucket, prefer)));
                        break;
                    }
                }
            }
        }
        // A file segment its last owner shrank while it was idle is not handed out again.
        if let Some(shrunk) = reused.take_if(|s| !s.intact(s.capacity)) {
            self.idle_bytes -= shrunk.capacity;
            shrunk.close(true);
        }
        let mut segment = match reused {
            Some(mut segment) => {
                self.idle_bytes -= segment.capacity;
                self.reuses += 1;
                self.scrub(&mut segment, size, zeroed);
                segment
            }
            None => {
                let capacity = self.make_room(class)?;
                let segment =
                    Segment::allocate(capacity, sealed, self.next_id, self.dir.as_deref())?;
                self.next_id += 1;
                self.allocations += 1;
                segment
            }
        };
        if let Some(uid) = uid {
            segment.uids.add(uid);
        }
        self.used_bytes += segment.capacity;
        self.used_segments += 1;
        Ok(segment)
    }

    /// Zero what the new owner must not see: everything old if it asked for zeros, else only
    /// the old bytes beyond `size` (the owner overwrites the rest, and the slack would
    /// otherwise travel with the object to whoever gets it next).
    fn scrub(&mut self, segment: &mut Segment, size: u64, zeroed: bool) {
        if segment.dirty == 0 {
            return;
        }
        let keep = if zeroed { 0 } else { size.min(segment.dirty) };
        if segment.dirty > keep {
            segment.zero(segment.dirty, keep);
            self.zeroed_bytes += segment.dirty - keep;
        }
        segment.dirty = keep;
    }

    /// Whether only `uid` was handed `segment`, so a mapping of it that a process of `uid`
    /// keeps can only ever serve that uid's objects again.
    pub fn returns_to(segment: &Segment, uid: u32) -> bool {
        segment.poolable && segment.uids.within(uid)
    }

    /// Take a segment a minion that went before left in use (its object is restored).
    pub fn adopt(&mut self, segment: &Segment) {
        self.used_bytes += segment.capacity;
        self.used_segments += 1;
        self.next_id = self.next_id.max(segment.id + 1);
    }

    /// Return a segment whose object is gone; `used` bytes of it may hold its data.
    pub fn release(&mut self, mut segment: Segment, used: u64) {
        self.forget(&segment);
        if !segment.poolable || !segment.intact(segment.capacity) {
            segment.close(true);
            return;
        }
        if segment.uids.len() > 1 {
            self.retired += 1;
            segment.close(false); // cooperative: its readers' mappings stay; nobody gets it again
            return;
        }
        if self.idle_bytes + segment.capacity > self.idle_limit {
            segment.close(false);
            return;
        }
        segment.dirty = segment.dirty.max(used.min(segment.capacity));
        self.idle_bytes += segment.capacity;
        self.idle
            .entry((segment.capacity, segment.poolable, segment.uids.only()))
            .or_default()
            .push(segment);
    }

    /// Revoke a segment for good: truncate so every stale mapping faults, then close.
    pub fn discard(&mut self, segment: Segment) {
        self.forget(&segment);
        segment.close(true);
    }

    /// Allocate `count` idle segments for objects of `size` bytes.
    pub fn prewarm(&mut self, size: u64, count: u64) -> Result<(), Failure> {
        let mut warm = Vec::new();
        for _ in 0..count {
            warm.push(self.acquire(size, true, &[], None, true)?);
        }
        for segment in warm {
            self.forget(&segment);
            self.idle_bytes += segment.capacity;
            self.idle
                .entry((segment.capacity, true, None))
                .or_default()
                .push(segment);
        }
        Ok(())
    }

    pub fn close(&mut self) {
        self.idle.clear(); // dropping a segment unmaps and closes it
        self.idle_bytes = 0;
    }

    fn forget(&mut self, segment: &Segment) {
        self.used_bytes -= segment.capacity;
        self.used_segments -= 1;
    }

    /// Make room for a new segment of `class` bytes, giving back idle segments (largest class
    /// first) before refusing; the capacity as u64 when it fits.
    fn make_room(&mut self, class: u128) -> Result<u64, CdiError> {
        let (used, limit) = (self.used_bytes as u128, self.memory_limit as u128);
        if used + self.idle_bytes as u128 + class > limit {
            for (&(capacity, _, _), bucket) in self.idle.iter_mut().rev() {
                while !bucket.is_empty() && used + self.idle_bytes as u128 + class > limit {
                    bucket.pop();
                    self.idle_bytes -= capacity;
                }
            }
            if used + class > limit {
                return Err(CdiError::out_of_memory(format!(
                    "a {class}-byte segment would exceed the minion's memory limit of {} bytes \
                     ({} in use)",
                    self.memory_limit, self.used_bytes
                )));
            }
        }
        Ok(class as u64) // <= memory_limit, a u64
    }
}

/// The file of segment `id` in a state folder's segment folder.
pub fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("segment-{id}"))
}

/// The id of a segment file by its name, if it is one.
pub fn segment_id(name: &str) -> Option<u64> {
    name.strip_prefix("segment-")?.parse().ok()
}

/// The most recently released segment of `bucket` whose id is in `prefer`; else the most
/// recently released one (its pages are the likeliest to be warm in cache).
fn preferred_index(bucket: &[Segment], prefer: &[i128]) -> usize {
    bucket
        .iter()
        .rposition(|s| prefer.contains(&(s.id as i128)))
        .unwrap_or(bucket.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    fn bytes(segment: &Segment, n: usize) -> Vec<u8> {
        // SAFETY: test segments are mapped for their capacity >= n.
        unsafe { std::slice::from_raw_parts(segment.addr, n).to_vec() }
    }

    fn write(segment: &Segment, data: &[u8]) {
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), segment.addr, data.len()) };
    }

    #[test]
    fn released_segments_serve_their_own_uid_only() {
        let mut pool = SegmentPool::new(1 << 30, 1 << 28, PAGE);
        let first = pool.acquire(10_000, true, &[], Some(1000), true).unwrap();
        assert_eq!((first.capacity, first.id), (12_288, 1));
        write(&first, b"secret");
        pool.release(first, 10_000);
        // Another uid never gets it: a new segment.
        let other = pool.acquire(9_000, true, &[], Some(1001), false).unwrap();
        assert_eq!((other.id, pool.reuses), (2, 0));
        assert_eq!(bytes(&other, 6), [0; 6]);
        // Same uid, no zeros asked: the old bytes stay within the size, beyond it are zeroed.
        let again = pool.acquire(9_000, true, &[], Some(1000), false).unwrap();
        assert_eq!((again.id, pool.reuses, pool.zeroed_bytes), (1, 1, 1_000));
        assert_eq!(bytes(&again, 6), b"secret");
        // Handed to a second uid (a transfer, a reader): retired, never pooled again.
        let mut shared = again;
        shared.uids.add(1001);
        assert!(!SegmentPool::returns_to(&shared, 1000));
        pool.release(shared, 9_000);
        assert_eq!((pool.retired, pool.idle_bytes), (1, 0));
        pool.release(other, 9_000);
        assert_eq!(pool.idle_bytes, 12_288);
        let back = pool.acquire(9_000, true, &[], Some(1001), true).unwrap();
        assert_eq!(back.id, 2);
        pool.discard(back);
        assert_eq!(
            (pool.used_bytes, pool.used_segments, pool.allocations),
            (0, 0, 2)
        );
    }

    #[test]
    fn preferred_segments_and_memory_limit() {
        let mut pool = SegmentPool::new(4 * PAGE, 4 * PAGE, PAGE);
        let a = pool.acquire(1, true, &[], None, true).unwrap();
        let b = pool.acquire(1, true, &[], None, true).unwrap();
        let (a_id, b_id) = (a.id, b.id);
        pool.release(a, 1);
        pool.release(b, 1);
        assert_eq!(
            pool.acquire(1, true, &[a_id as i128], None, true)
                .unwrap()
                .id,
            a_id
        );
        assert_eq!(pool.idle_bytes, PAGE);
        // Needs 3 pages with 1 in use (leaked above) and 1 idle: the idle one is given back.
        let big = pool.acquire(3 * PAGE, true, &[], None, true).unwrap();
        assert_eq!((big.capacity, pool.idle_bytes), (3 * PAGE, 0));
        let err = pool.acquire(1, true, &[], None, true).unwrap_err();
        let Failure::Cdi(err) = err else { panic!() };
        assert_eq!(err.code, "out_of_memory");
        assert_eq!(
            err.msg,
            "a 4096-byte segment would exceed the minion's memory limit of 16384 bytes (16384 in use)"
        );
        let _ = b_id;
    }

    #[test]
    fn strict_copies_survive_a_truncated_source() {
        let mut pool = SegmentPool::new(1 << 30, 1 << 28, PAGE);
        let mut source = pool.acquire(3 * PAGE, false, &[], None, true).unwrap();
        write(&source, b"data");
        let mut fresh = pool.acquire(3 * PAGE, false, &[], None, true).unwrap();
        fresh.copy_from(&source, 3 * PAGE);
        assert_eq!(bytes(&fresh, 4), b"data");
        unsafe { libc::ftruncate(source.fd, 0) };
        assert!(!source.intact(1));
        fresh.copy_from(&source, 3 * PAGE); // no SIGBUS: a short read
        source.zero(3 * PAGE, 0); // no SIGBUS: pwrite extends the file
        pool.discard(source);
        pool.discard(fresh);
    }

    fn pread_all(segment: &Segment, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        // SAFETY: out is valid for n bytes.
        let got = unsafe { libc::pread(segment.fd, out.as_mut_ptr().cast(), n, 0) };
        assert_eq!(got, n as isize);
        out
    }

    #[test]
    fn file_segments_outlive_their_handle_until_freed() {
        let dir = std::env::temp_dir().join(format!("cdi-segments-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut pool = SegmentPool::new(1 << 30, 1 << 28, PAGE);
        pool.dir = Some(dir.clone());
        let mut first = pool.acquire(5_000, true, &[], Some(1000), true).unwrap();
        // A file: not sealed, but pooled like a cooperative memfd; touched with pwrite only.
        assert!(!first.sealed && first.poolable);
        assert_eq!(first.path, Some(segment_path(&dir, first.id)));
        let source = pool.acquire(5_000, false, &[], None, true).unwrap();
        // SAFETY: b"kept" is valid for 4 bytes.
        unsafe { libc::pwrite(source.fd, b"kept".as_ptr().cast(), 4, 0) };
        first.copy_from(&source, 5_000);
        drop(source); // freed: its file goes
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        // What a restarted minion does: open the file again by its id.
        let again = Segment::reopen(&dir, first.id, first.capacity, true).unwrap();
        assert_eq!(pread_all(&again, 4), b"kept");
        assert!(Segment::reopen(&dir, 999, PAGE, true).is_none());
        let mut next = SegmentPool::new(1 << 30, 1 << 28, PAGE);
        next.adopt(&again);
        assert_eq!((next.next_id, next.used_segments), (first.id + 1, 1));
        assert_eq!(segment_id("segment-17"), Some(17));
        assert_eq!(segment_id("journal"), None);
        // Released to the pool it stays; shrunk while idle, it is not handed out again.
        pool.release(first, 5_000);
        assert_eq!(pool.idle_bytes, 8_192);
        // SAFETY: truncating the file of the fd we reopened.
        unsafe { libc::ftruncate(again.fd, 0) };
        let fresh = pool.acquire(5_000, true, &[], Some(1000), true).unwrap();
        assert_eq!((pool.reuses, pool.idle_bytes), (0, 0));
        drop(fresh);
        drop(again);
        pool.close();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
    }
}
