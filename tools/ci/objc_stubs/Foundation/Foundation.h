// Declaration-only stand-in for Apple's <Foundation/Foundation.h>, used by
// tools/ci/check_objc.sh to type-check csrc/backend/metal/*.mm on Linux with clang.
//
// It declares ONLY what fastmetal's Objective-C++ uses. Every declaration copies the
// signature of Apple's macOS SDK header it comes from (nullability, instancetype,
// NS_ENUM/NS_OPTIONS types, attributes that change type checking). Never loosen a
// signature to make code pass: the gate is only worth as much as these lines.
#pragma once
#ifndef __OBJC__
#error "Foundation stubs are Objective-C only"
#endif

#include <stddef.h>
#include <stdint.h>

// ---- NSObjCRuntime.h -----------------------------------------------------------------
#if defined(__LP64__) && __LP64__
typedef long NSInteger;
typedef unsigned long NSUInteger;
#else
typedef int NSInteger;
typedef unsigned int NSUInteger;
#endif

// objc/objc.h: BOOL is `bool` on arm64 and `signed char` on x86_64.
#if defined(__arm64__) || defined(__aarch64__)
typedef bool BOOL;
#else
typedef signed char BOOL;
#endif
#define YES __objc_yes
#define NO __objc_no
#define nil nullptr  // objc/objc.h, C++11 branch

// sys/cdefs.h (Apple): the double-underscore nullability spelling used by Metal's headers.
// (Apple's __nonnull is not defined here: glibc's <sys/cdefs.h> owns that name on Linux.)
#define __nullable _Nullable

#define NS_ASSUME_NONNULL_BEGIN _Pragma("clang assume_nonnull begin")
#define NS_ASSUME_NONNULL_END _Pragma("clang assume_nonnull end")
#define NS_RETURNS_RETAINED __attribute__((ns_returns_retained))
#define NS_RETURNS_INNER_POINTER __attribute__((objc_returns_inner_pointer))
#define NS_SWIFT_SENDABLE
#define NS_NOESCAPE __attribute__((noescape))
#define API_AVAILABLE(...)
#define API_DEPRECATED(...)
#define API_DEPRECATED_WITH_REPLACEMENT(...)
#define API_UNAVAILABLE(...)

// CFAvailability.h (C++ branch): NS_ENUM is a fixed-type enum (no implicit int -> enum
// conversion in C++), NS_OPTIONS is the integer type itself plus an anonymous enum.
#define NS_ENUM(_type, _name) \
  enum __attribute__((enum_extensibility(open))) _name : _type _name; \
  enum __attribute__((enum_extensibility(open))) _name : _type
#define NS_OPTIONS(_type, _name) \
  _type _name;                   \
  enum __attribute__((flag_enum, enum_extensibility(open))) : _type

NS_ASSUME_NONNULL_BEGIN

// ---- NSObject.h ----------------------------------------------------------------------
@protocol NSObject
@end

__attribute__((objc_root_class))
@interface NSObject <NSObject>
+ (instancetype)alloc;
- (instancetype)init;
@end

// ---- NSRange.h -----------------------------------------------------------------------
typedef struct _NSRange {
  NSUInteger location;
  NSUInteger length;
} NSRange;

static inline NSRange NSMakeRange(NSUInteger loc, NSUInteger len) {
  NSRange r;
  r.location = loc;
  r.length = len;
  return r;
}

// ---- NSString.h ----------------------------------------------------------------------
@interface NSString : NSObject
+ (nullable instancetype)stringWithUTF8String:(const char *)nullTerminatedCString;
@property (nullable, readonly) const char *UTF8String NS_RETURNS_INNER_POINTER;
@end

// ---- NSArray.h -----------------------------------------------------------------------
@interface NSArray<__covariant ObjectType> : NSObject
@property (readonly) NSUInteger count;
- (ObjectType)objectAtIndex:(NSUInteger)index;
@end

// ---- NSError.h -----------------------------------------------------------------------
@interface NSError : NSObject
@property (readonly, copy) NSString *localizedDescription;
@end

// ---- NSException.h ------------------------------------------------------------------
typedef NSString *NSExceptionName;  // NS_TYPED_EXTENSIBLE_ENUM

@interface NSException : NSObject
@property (readonly, copy) NSExceptionName name;
@property (nullable, readonly, copy) NSString *reason;
@end

NS_ASSUME_NONNULL_END
