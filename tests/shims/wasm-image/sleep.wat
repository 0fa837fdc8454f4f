;; A WASI preview 1 command that runs until it is killed: prints "sleeping" on stdout, then waits
;; in 1 s steps with poll_oneoff (one relative clock subscription) for ever. A poll_oneoff error
;; ends it through proc_exit with that errno. (A pod's long-running container: it ignores SIGTERM
;; as the pid 1 of its pid namespace, so the kubelet kills it after the grace period.)
(module
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit"
    (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  ;; one iovec at 0: { buf = 16, len = 9 }; bytes written go to 8
  (data (i32.const 0) "\10\00\00\00\09\00\00\00")
  (data (i32.const 16) "sleeping\n")
  ;; a subscription at 64 (48 bytes): userdata u64 @64, tag u8 @72 (0: clock),
  ;; clock id u32 @80 (1: monotonic), timeout u64 @88 (ns), precision u64 @96, flags u16 @104
  ;; (0: relative); the event goes to 128 (32 bytes), the number of events to 160
  (func (export "_start")
    (local $errno i32)
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i64.store (i32.const 64) (i64.const 0))
    (i32.store8 (i32.const 72) (i32.const 0))
    (i32.store (i32.const 80) (i32.const 1))
    (i64.store (i32.const 88) (i64.const 1000000000))
    (i64.store (i32.const 96) (i64.const 0))
    (i32.store16 (i32.const 104) (i32.const 0))
    (loop $again
      (local.set $errno
        (call $poll_oneoff (i32.const 64) (i32.const 128) (i32.const 1) (i32.const 160)))
      (br_if $again (i32.eqz (local.get $errno))))
    (call $proc_exit (local.get $errno))))
