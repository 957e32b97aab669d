// Declaration-only stand-in for Apple's <dispatch/dispatch.h> (libdispatch as seen from
// Objective-C with OS_OBJECT_USE_OBJC=1: dispatch objects are NSObject-based and ARC
// manages them). Only what fastmetal uses; signatures copied from the macOS SDK
// (dispatch/object.h, dispatch/queue.h, dispatch/data.h, os/object.h).
#pragma once
#ifndef __OBJC__
#error "dispatch stubs are Objective-C only"
#endif

#import <Foundation/Foundation.h>

// os/object.h: OS_OBJECT_DECL_CLASS / OS_OBJECT_DECL_SUBCLASS
#define FM_STUB_OS_OBJECT_DECL(name, super) \
  @protocol OS_##name <super>               \
  @end                                      \
  typedef NSObject<OS_##name> *__attribute__((objc_independent_class)) name##_t

@protocol OS_dispatch_object <NSObject>
@end
typedef NSObject<OS_dispatch_object> *__attribute__((objc_independent_class)) dispatch_object_t;

FM_STUB_OS_OBJECT_DECL(dispatch_queue, OS_dispatch_object);
FM_STUB_OS_OBJECT_DECL(dispatch_queue_global, OS_dispatch_queue);
FM_STUB_OS_OBJECT_DECL(dispatch_data, OS_dispatch_object);

// dispatch/object.h
typedef void (^dispatch_block_t)(void);

// dispatch/queue.h
#define DISPATCH_QUEUE_PRIORITY_DEFAULT 0
NS_ASSUME_NONNULL_BEGIN
extern "C" __attribute__((const, warn_unused_result, nothrow))
dispatch_queue_global_t dispatch_get_global_queue(intptr_t identifier, uintptr_t flags);

// dispatch/data.h
#define DISPATCH_DATA_DESTRUCTOR_DEFAULT NULL
extern "C" __attribute__((ns_returns_retained, warn_unused_result, nothrow))
dispatch_data_t dispatch_data_create(const void *buffer, size_t size,
                                     dispatch_queue_t _Nullable queue,
                                     dispatch_block_t _Nullable destructor);
NS_ASSUME_NONNULL_END
