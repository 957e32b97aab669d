// Declaration-only stand-in for Apple's <Metal/Metal.h>, used by tools/check_objc.sh.
// Only the API fastmetal's backend uses; each declaration copies the macOS SDK header
// named above it (MTLDevice.h, MTLCommandQueue.h, MTLCommandBuffer.h, MTLCommandEncoder.h,
// MTLComputeCommandEncoder.h, MTLComputePipeline.h, MTLLibrary.h, MTLBuffer.h,
// MTLResource.h, MTLTypes.h, MTLBlitCommandEncoder.h, MTLIndirectCommandBuffer.h,
// MTLIndirectCommandEncoder.h): nullability, protocol types, NS_ENUM/NS_OPTIONS, blocks.
#pragma once
#ifndef __OBJC__
#error "Metal stubs are Objective-C only"
#endif

#import <Foundation/Foundation.h>
#import <dispatch/dispatch.h>

// MTLDefines.h
#ifdef __cplusplus
#define MTL_EXTERN extern "C" __attribute__((visibility ("default")))
#else
#define MTL_EXTERN extern __attribute__((visibility ("default")))
#endif

NS_ASSUME_NONNULL_BEGIN

@protocol MTLDevice;
@protocol MTLCommandQueue;
@protocol MTLCommandBuffer;
@protocol MTLComputeCommandEncoder;
@protocol MTLComputePipelineState;
@protocol MTLFunction;
@protocol MTLLibrary;
@protocol MTLBuffer;
@protocol MTLBlitCommandEncoder;
@protocol MTLIndirectCommandBuffer;
@protocol MTLIndirectComputeCommand;

// ---- MTLTypes.h ----------------------------------------------------------------------
typedef struct {
  NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize size = {width, height, depth};
  return size;
}

// ---- MTLResource.h -------------------------------------------------------------------
typedef NS_ENUM(NSUInteger, MTLCPUCacheMode){
    MTLCPUCacheModeDefaultCache = 0,
    MTLCPUCacheModeWriteCombined = 1,
};

typedef NS_ENUM(NSUInteger, MTLStorageMode){
    MTLStorageModeShared = 0,
    MTLStorageModeManaged = 1,
    MTLStorageModePrivate = 2,
    MTLStorageModeMemoryless = 3,
};

typedef NS_ENUM(NSUInteger, MTLHazardTrackingMode){
    MTLHazardTrackingModeDefault = 0,
    MTLHazardTrackingModeUntracked = 1,
    MTLHazardTrackingModeTracked = 2,
};

#define MTLResourceCPUCacheModeShift 0
#define MTLResourceStorageModeShift 4
#define MTLResourceHazardTrackingModeShift 8

typedef NS_OPTIONS(NSUInteger, MTLResourceOptions){
    MTLResourceCPUCacheModeDefaultCache = MTLCPUCacheModeDefaultCache << MTLResourceCPUCacheModeShift,
    MTLResourceCPUCacheModeWriteCombined = MTLCPUCacheModeWriteCombined << MTLResourceCPUCacheModeShift,
    MTLResourceStorageModeShared = MTLStorageModeShared << MTLResourceStorageModeShift,
    MTLResourceStorageModeManaged = MTLStorageModeManaged << MTLResourceStorageModeShift,
    MTLResourceStorageModePrivate = MTLStorageModePrivate << MTLResourceStorageModeShift,
    MTLResourceStorageModeMemoryless = MTLStorageModeMemoryless << MTLResourceStorageModeShift,
    MTLResourceHazardTrackingModeDefault = MTLHazardTrackingModeDefault << MTLResourceHazardTrackingModeShift,
    MTLResourceHazardTrackingModeUntracked = MTLHazardTrackingModeUntracked << MTLResourceHazardTrackingModeShift,
    MTLResourceHazardTrackingModeTracked = MTLHazardTrackingModeTracked << MTLResourceHazardTrackingModeShift,
};

@protocol MTLResource <NSObject>
@end

// ---- MTLBuffer.h ---------------------------------------------------------------------
@protocol MTLBuffer <MTLResource>
@property (readonly) NSUInteger length;
- (void *)contents NS_RETURNS_INNER_POINTER;
@end

// ---- MTLLibrary.h --------------------------------------------------------------------
@protocol MTLFunction <NSObject>
@end

@protocol MTLLibrary <NSObject>
- (nullable id<MTLFunction>)newFunctionWithName:(NSString *)functionName;
@property (readonly) NSArray<NSString *> *functionNames;
@end

// ---- MTLComputePipeline.h ------------------------------------------------------------
@protocol MTLComputePipelineState <NSObject>
@property (readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property (readonly) NSUInteger threadExecutionWidth;
@end

@interface MTLComputePipelineReflection : NSObject
@end

@interface MTLComputePipelineDescriptor : NSObject
@property (nullable, readwrite, nonatomic, strong) id <MTLFunction> computeFunction;
@property (readwrite, nonatomic) BOOL supportIndirectCommandBuffers API_AVAILABLE(macos(10.14), ios(12.0));
@end

// ---- MTLIndirectCommandEncoder.h -----------------------------------------------------
API_AVAILABLE(macos(11.0), ios(13.0))
@protocol MTLIndirectComputeCommand <NSObject>
- (void)setComputePipelineState:(id <MTLComputePipelineState>)pipelineState API_AVAILABLE(macos(11.0), ios(13.0));
- (void)setKernelBuffer:(id <MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)concurrentDispatchThreadgroups:(MTLSize)threadgroupsPerGrid
                 threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)concurrentDispatchThreads:(MTLSize)threadsPerGrid
            threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)setBarrier;
- (void)clearBarrier;
@end

// ---- MTLIndirectCommandBuffer.h ------------------------------------------------------
typedef NS_OPTIONS(NSUInteger, MTLIndirectCommandType) {
    MTLIndirectCommandTypeDraw                = (1 << 0),
    MTLIndirectCommandTypeDrawIndexed         = (1 << 1),
    MTLIndirectCommandTypeDrawPatches         = (1 << 2),
    MTLIndirectCommandTypeDrawIndexedPatches  = (1 << 3),
    MTLIndirectCommandTypeConcurrentDispatch API_AVAILABLE(macos(11.0), ios(13.0)) = (1 << 5),
    MTLIndirectCommandTypeConcurrentDispatchThreads API_AVAILABLE(macos(11.0), ios(13.0)) = (1 << 6),
} API_AVAILABLE(macos(10.14), ios(12.0));

API_AVAILABLE(macos(10.14), ios(12.0))
@interface MTLIndirectCommandBufferDescriptor : NSObject
@property (readwrite, nonatomic) MTLIndirectCommandType commandTypes;
@property (readwrite, nonatomic) BOOL inheritPipelineState API_AVAILABLE(macos(10.14), ios(13.0));
@property (readwrite, nonatomic) BOOL inheritBuffers;
@property (readwrite, nonatomic) NSUInteger maxKernelBufferBindCount API_AVAILABLE(macos(11.0), ios(13.0));
@end

API_AVAILABLE(macos(10.14), ios(12.0))
@protocol MTLIndirectCommandBuffer <MTLResource>
@property (readonly) NSUInteger size;
- (void)resetWithRange:(NSRange)range;
- (id <MTLIndirectComputeCommand>)indirectComputeCommandAtIndex:(NSUInteger)commandIndex API_AVAILABLE(macos(11.0), ios(13.0));
@end

// ---- MTLCommandEncoder.h -------------------------------------------------------------
@protocol MTLCommandEncoder <NSObject>
- (void)endEncoding;
@end

// ---- MTLCommandEncoder.h (MTLResourceUsage) ------------------------------------------
typedef NS_OPTIONS(NSUInteger, MTLResourceUsage) {
    MTLResourceUsageRead   = 1 << 0,
    MTLResourceUsageWrite  = 1 << 1,
} API_AVAILABLE(macos(10.13), ios(11.0));

// ---- MTLComputeCommandEncoder.h ------------------------------------------------------
@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void *)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(nullable id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)useResources:(const id <MTLResource> _Nonnull[_Nonnull])resources count:(NSUInteger)count usage:(MTLResourceUsage)usage API_AVAILABLE(macos(10.13), ios(11.0));
- (void)executeCommandsInBuffer:(id<MTLIndirectCommandBuffer>)indirectCommandbuffer withRange:(NSRange)executionRange API_AVAILABLE(macos(11.0), ios(13.0));
@end

// ---- MTLBlitCommandEncoder.h ---------------------------------------------------------
@protocol MTLBlitCommandEncoder <MTLCommandEncoder>
- (void)copyFromBuffer:(id<MTLBuffer>)sourceBuffer sourceOffset:(NSUInteger)sourceOffset toBuffer:(id<MTLBuffer>)destinationBuffer destinationOffset:(NSUInteger)destinationOffset size:(NSUInteger)size;
@end

// ---- MTLCommandBuffer.h --------------------------------------------------------------
typedef NS_ENUM(NSUInteger, MTLCommandBufferStatus){
    MTLCommandBufferStatusNotEnqueued = 0,
    MTLCommandBufferStatusEnqueued = 1,
    MTLCommandBufferStatusCommitted = 2,
    MTLCommandBufferStatusScheduled = 3,
    MTLCommandBufferStatusCompleted = 4,
    MTLCommandBufferStatusError = 5,
};

typedef NS_ENUM(NSUInteger, MTLDispatchType){
    MTLDispatchTypeSerial,
    MTLDispatchTypeConcurrent,
};

@protocol MTLCommandBuffer <NSObject>
- (void)commit;
- (void)waitUntilCompleted;
@property (readonly) MTLCommandBufferStatus status;
@property (nullable, readonly) NSError *error;
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoderWithDispatchType:(MTLDispatchType)dispatchType;
- (nullable id <MTLBlitCommandEncoder>)blitCommandEncoder;
@end

// ---- MTLCommandQueue.h ---------------------------------------------------------------
@protocol MTLCommandQueue <NSObject>
- (nullable id<MTLCommandBuffer>)commandBuffer;
@end

// ---- MTLDevice.h ---------------------------------------------------------------------
typedef NS_OPTIONS(NSUInteger, MTLPipelineOption) {
    MTLPipelineOptionNone               = 0,
    MTLPipelineOptionArgumentInfo       = 1 << 0,
    MTLPipelineOptionBufferTypeInfo     = 1 << 1,
} API_AVAILABLE(macos(10.11), ios(8.0));

typedef __autoreleasing MTLComputePipelineReflection * __nullable MTLAutoreleasedComputePipelineReflection;

typedef NS_ENUM(NSInteger, MTLGPUFamily){
    // (the Apple1..Apple10, Mac2, Common1..3 and Metal4 members are not used here)
    MTLGPUFamilyMetal3 = 5001,
};

@protocol MTLDevice <NSObject>
@property (nonnull, readonly) NSString *name;
@property (readonly) MTLSize maxThreadsPerThreadgroup;
@property (readonly) NSUInteger maxBufferLength;
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;
- (nullable id<MTLCommandQueue>)newCommandQueue;
- (nullable id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (nullable id<MTLBuffer>)newBufferWithBytes:(const void *)pointer
                                      length:(NSUInteger)length
                                     options:(MTLResourceOptions)options;
- (nullable id<MTLBuffer>)newBufferWithBytesNoCopy:(void *)pointer
                                            length:(NSUInteger)length
                                           options:(MTLResourceOptions)options
                                       deallocator:(void (^NS_SWIFT_SENDABLE __nullable)(void *pointer, NSUInteger length))deallocator;
- (nullable id<MTLLibrary>)newLibraryWithData:(dispatch_data_t)data error:(__autoreleasing NSError **)error;
- (nullable id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                                      error:(__autoreleasing NSError **)error;
- (nullable id <MTLComputePipelineState>)newComputePipelineStateWithDescriptor:(MTLComputePipelineDescriptor *)descriptor
                                                                       options:(MTLPipelineOption)options
                                                                    reflection:(MTLAutoreleasedComputePipelineReflection * __nullable)reflection
                                                                         error:(__autoreleasing NSError **)error API_AVAILABLE(macos(10.11), ios(9.0));
- (nullable id <MTLIndirectCommandBuffer>)newIndirectCommandBufferWithDescriptor:(MTLIndirectCommandBufferDescriptor*)descriptor
                                                                 maxCommandCount:(NSUInteger)maxCount
                                                                         options:(MTLResourceOptions)options API_AVAILABLE(macos(10.14), ios(12.0));
@end

// MTLDevice.h
MTL_EXTERN id <MTLDevice> __nullable MTLCreateSystemDefaultDevice(void) API_AVAILABLE(macos(10.11), ios(8.0)) NS_RETURNS_RETAINED;
MTL_EXTERN NSArray <id<MTLDevice>> *MTLCopyAllDevices(void) API_AVAILABLE(macos(10.11), macCatalyst(13.0)) API_UNAVAILABLE(ios) NS_RETURNS_RETAINED;

NS_ASSUME_NONNULL_END
