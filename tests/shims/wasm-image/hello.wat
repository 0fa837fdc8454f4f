;; A WASI preview 1 command: prints "hello from wasm" on stdout, then exits with fd_write's errno
;; (0 on success) through proc_exit.
(module
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit"
    (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  ;; one iovec at 0: { buf = 16, len = 16 }; bytes written go to 8
  (data (i32.const 0) "\10\00\00\00\10\00\00\00")
  (data (i32.const 16) "hello from wasm\n")
  (func (export "_start")
    (call $proc_exit
      (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
