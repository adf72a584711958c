// Clang thread-safety annotations (leveldb port/thread_annotations.h, abseil thread_annotations.h).
//
// They turn "which lock guards which field" from a comment into something the compiler checks:
// build with clang and -Wthread-safety (scripts/check-thread-safety.sh does, as the ctest test
// `thread_safety`) and reading a GUARDED_BY field without its mutex, or calling a REQUIRES function
// without the lock, is an error. With gcc every macro expands to nothing.
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_);
//   void bump_locked() REQUIRES(mu_);   // caller holds mu_
//   void bump() EXCLUDES(mu_);          // takes mu_ itself; calling it with mu_ held deadlocks
//
// The lock type is longhaul::Mutex (longhaul/base/mutex.h): libstdc++'s std::mutex carries no
// capability attributes, so fields guarded by a std::mutex cannot be checked.
#pragma once

#if defined(__clang__)
#define LONGHAUL_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define LONGHAUL_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (a "capability"): longhaul::Mutex.
#ifndef CAPABILITY
#define CAPABILITY(name) LONGHAUL_THREAD_ANNOTATION(capability(name))
#endif
// An RAII type that holds a capability from construction to destruction: longhaul::MutexLock.
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY LONGHAUL_THREAD_ANNOTATION(scoped_lockable)
#endif
// The field may be read or written only while holding the given mutex.
#ifndef GUARDED_BY
#define GUARDED_BY(x) LONGHAUL_THREAD_ANNOTATION(guarded_by(x))
#endif
// The data the pointer points to may be accessed only while holding the given mutex.
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) LONGHAUL_THREAD_ANNOTATION(pt_guarded_by(x))
#endif
// Lock ordering: this mutex is acquired after / before the given ones.
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) LONGHAUL_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#endif
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) LONGHAUL_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#endif
// The caller must hold the given mutexes (the "_locked" helpers).
#ifndef REQUIRES
#define REQUIRES(...) LONGHAUL_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#endif
// The caller must NOT hold the given mutexes: the function takes them itself.
#ifndef EXCLUDES
#define EXCLUDES(...) LONGHAUL_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#endif
// The function acquires / releases the given mutexes (this object's, when none is named).
#ifndef ACQUIRE
#define ACQUIRE(...) LONGHAUL_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) LONGHAUL_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#endif
#ifndef TRY_ACQUIRE
#define TRY_ACQUIRE(...) LONGHAUL_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#endif
// The function checks at run time that the mutex is held; afterwards the analysis assumes it is.
#ifndef ASSERT_CAPABILITY
#define ASSERT_CAPABILITY(x) LONGHAUL_THREAD_ANNOTATION(assert_capability(x))
#endif
// The function returns a reference to the given mutex.
#ifndef RETURN_CAPABILITY
#define RETURN_CAPABILITY(x) LONGHAUL_THREAD_ANNOTATION(lock_returned(x))
#endif
// Opts a function out of the analysis. Use sparingly, with a comment saying why it is safe.
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS LONGHAUL_THREAD_ANNOTATION(no_thread_safety_analysis)
#endif
