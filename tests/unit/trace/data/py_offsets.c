// offsetof() of the CPython structs a stack walk reads, compiled against one version's
// installed headers (tests/unit/trace/test_pyframes_layout.py compares ingero/trace/pyframes/layout.py).
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#else
#include "frameobject.h"
#endif
#include "internal/pycore_code.h"
#define P(name, expr) printf("%s=%zu\n", name, (size_t)(expr))
int main(void) {
  P("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
  #if PY_VERSION_HEX >= 0x030B0000
  P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
#else
  P("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
#endif
  P("tstate_next", offsetof(PyThreadState, next));
  P("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030B0000
  P("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
#endif
#if PY_VERSION_HEX >= 0x030D0000
  P("tstate_current_frame", offsetof(PyThreadState, current_frame));
#elif PY_VERSION_HEX >= 0x030B0000
  P("tstate_cframe", offsetof(PyThreadState, cframe));
  P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
#else
  P("tstate_frame", offsetof(PyThreadState, frame));
  P("frame_back", offsetof(PyFrameObject, f_back));
  P("frame_code", offsetof(PyFrameObject, f_code));
  P("frame_lasti", offsetof(PyFrameObject, f_lasti));
#endif
#if PY_VERSION_HEX >= 0x030B0000
  P("frame_previous", offsetof(_PyInterpreterFrame, previous));
#if PY_VERSION_HEX >= 0x030D0000
  P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
  P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#else
  P("frame_code", offsetof(_PyInterpreterFrame, f_code));
  P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#endif
  P("frame_owner", offsetof(_PyInterpreterFrame, owner));
  P("code_qualname", offsetof(PyCodeObject, co_qualname));
  P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#endif
  P("code_filename", offsetof(PyCodeObject, co_filename));
  P("code_name", offsetof(PyCodeObject, co_name));
  P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
  P("code_linetable", offsetof(PyCodeObject, co_linetable));
  P("bytes_size", offsetof(PyVarObject, ob_size));
  P("bytes_sval", offsetof(PyBytesObject, ob_sval));
  P("unicode_state", offsetof(PyASCIIObject, state));
  P("unicode_length", offsetof(PyASCIIObject, length));
  P("ascii_size", sizeof(PyASCIIObject));
  P("compact_size", sizeof(PyCompactUnicodeObject));
  return 0;
}
