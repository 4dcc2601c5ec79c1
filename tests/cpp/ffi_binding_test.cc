// Tests for the handler signatures in csrc/ffi_binding.h, fed call frames
// laid out the way each XLA runtime sends them.
//
// The wheel is compiled against the oldest supported FFI headers (API 0.2)
// and runs under newer XLA runtimes, which do not call handlers the way
// 0.2's runtime did: XLA's GPU runtime passes the call's operands and
// results at the instantiate stage too. A handler whose binding rejects
// that fails every GPU call, while the CPU path (no buffers at instantiate)
// hides it. scripts/cpp_tests.sh compiles this file against the headers
// the wheel ships, so the check here is the one the wheel makes.
#include "ffi_binding.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

// The C API leaves XLA_FFI_Error opaque; this runtime stand-in defines it.
struct XLA_FFI_Error {
  std::string message;
};

namespace {

namespace ffi = ::xla::ffi;

// What an instantiate handler hands XLA: a state object with a type id.
struct FakeSite {
  static ffi::TypeId id;
  std::string key;
};
ffi::TypeId FakeSite::id = {1234};

// The runtime's side of the few C API functions an instantiate handler
// calls: errors are created (and destroyed), state is stored.
struct FakeRuntime {
  static inline std::unique_ptr<FakeSite> stored;

  static XLA_FFI_Error* ErrorCreate(XLA_FFI_Error_Create_Args* args) {
    return new XLA_FFI_Error{args->message ? args->message : ""};
  }
  static void ErrorDestroy(XLA_FFI_Error_Destroy_Args* args) {
    delete args->error;
  }
  static XLA_FFI_Error* StateSet(XLA_FFI_State_Set_Args* args) {
    if (args->type_id->type_id != FakeSite::id.type_id) {
      return new XLA_FFI_Error{"state of an unexpected type"};
    }
    stored.reset(static_cast<FakeSite*>(args->state));
    return nullptr;
  }

  FakeRuntime() {
    api.struct_size = XLA_FFI_Api_STRUCT_SIZE;
    api.XLA_FFI_Error_Create = &ErrorCreate;
    api.XLA_FFI_Error_Destroy = &ErrorDestroy;
    api.XLA_FFI_State_Set = &StateSet;
    stored.reset();
  }
  XLA_FFI_Api api{};
};

// A call frame of one call: `inputs` operands and `outputs` results (all
// f32[4] buffers with no data behind them: instantiate must not read them)
// and the one attribute numbax's ops carry, "key".
class InstantiateFrame {
 public:
  InstantiateFrame(const XLA_FFI_Api* api, int inputs, int outputs,
                   std::string key)
      : key_(std::move(key)) {
    buffer_ = XLA_FFI_Buffer{XLA_FFI_Buffer_STRUCT_SIZE,
                             nullptr,
                             XLA_FFI_DataType_F32,
                             nullptr,
                             1,
                             dims_};
    arg_types_.assign(inputs, XLA_FFI_ArgType_BUFFER);
    arg_ptrs_.assign(inputs, &buffer_);
    ret_types_.assign(outputs, XLA_FFI_RetType_BUFFER);
    ret_ptrs_.assign(outputs, &buffer_);
    name_ = XLA_FFI_ByteSpan{kName, sizeof(kName) - 1};
    value_ = XLA_FFI_ByteSpan{key_.data(), key_.size()};
    name_ptr_ = &name_;
    attr_type_ = XLA_FFI_AttrType_STRING;
    attr_ptr_ = &value_;

    frame_.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
    frame_.api = api;
    frame_.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
    frame_.args = XLA_FFI_Args{XLA_FFI_Args_STRUCT_SIZE, nullptr, inputs,
                               arg_types_.data(), arg_ptrs_.data()};
    frame_.rets = XLA_FFI_Rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr, outputs,
                               ret_types_.data(), ret_ptrs_.data()};
    frame_.attrs = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE,
                                 nullptr,
                                 1,
                                 &attr_type_,
                                 &name_ptr_,
                                 &attr_ptr_};
  }

  XLA_FFI_CallFrame* get() { return &frame_; }

 private:
  static constexpr char kName[] = "key";
  std::string key_;
  int64_t dims_[1] = {4};
  XLA_FFI_Buffer buffer_{};
  std::vector<XLA_FFI_ArgType> arg_types_;
  std::vector<void*> arg_ptrs_;
  std::vector<XLA_FFI_RetType> ret_types_;
  std::vector<void*> ret_ptrs_;
  XLA_FFI_ByteSpan name_{}, value_{};
  XLA_FFI_ByteSpan* name_ptr_ = nullptr;
  XLA_FFI_AttrType attr_type_{};
  void* attr_ptr_ = nullptr;
  XLA_FFI_CallFrame frame_{};
};

ffi::ErrorOr<std::unique_ptr<FakeSite>> MakeSite(ffi::RemainingArgs,
                                                 ffi::RemainingRets,
                                                 std::string_view key) {
  auto site = std::make_unique<FakeSite>();
  site->key = std::string(key);
  return site;
}

// Runs the instantiate binding numbax's handlers use on one frame; returns
// the error message, or "" on success.
std::string Instantiate(int inputs, int outputs, const std::string& key) {
  FakeRuntime runtime;
  auto handler = numbax::BindInstantiate().To(MakeSite);
  InstantiateFrame frame(&runtime.api, inputs, outputs, key);
  XLA_FFI_Error* error = handler->Call(frame.get());
  if (error != nullptr) {
    std::string message = error->message;
    delete error;
    return message.empty() ? "(empty error)" : message;
  }
  if (!FakeRuntime::stored) return "no state was set";
  if (FakeRuntime::stored->key != key) {
    return "key decoded as '" + FakeRuntime::stored->key + "'";
  }
  return "";
}

TEST(InstantiateBinding, NoBuffersAsXlaCpuSendsThem) {
  EXPECT_EQ(Instantiate(0, 0, "mod.fn#abc"), "");
}

TEST(InstantiateBinding, OneOperandAndResultAsXlaGpuSendsThem) {
  // The call every GPU op failed with ("Wrong number of arguments: expected
  // 0 but got 1") when the binding bound no buffers.
  EXPECT_EQ(Instantiate(1, 1, "mod.fn#abc"), "");
}

TEST(InstantiateBinding, ManyOperandsAndResults) {
  EXPECT_EQ(Instantiate(7, 3, "stdp#0123456789abcdef"), "");
}

TEST(InstantiateBinding, ResultsButNoOperands) {
  EXPECT_EQ(Instantiate(0, 2, "zeros#1"), "");
}

}  // namespace
