// The registered KV methods, one line each: VQ_KV_METHOD(x) names the function
// `const KVMethodDef& x_method()` defined in kvcache/methods/. The order is the order of the
// help text, of eval's default list and of every other method list.
// Included twice by kvcache/kv_method.cpp (declarations, then the registry); no include guard.
VQ_KV_METHOD(fp16)
VQ_KV_METHOD(fp32)
VQ_KV_METHOD(q8_0)
VQ_KV_METHOD(q4_0)
VQ_KV_METHOD(q4_0h)
VQ_KV_METHOD(q5_0)
VQ_KV_METHOD(kivi)
VQ_KV_METHOD(vecinfer)
