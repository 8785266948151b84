from harness import *
import keras_hub as hub, tempfile
D = 8
enc = hub.layers.TransformerEncoder(16, 2, activation="gelu"); enc.build((None, None, D))
mha = keras.layers.MultiHeadAttention(2, 4, sliding_window=3); mha.build((None, None, D), (None, None, D))
xi = keras.Input((None, D), name="x"); mi = keras.Input((None,), dtype="bool", name="m")
h = convert.from_keras(enc)(xi, padding_mask=mi)
h = convert.from_keras(mha)(h, padding_mask=mi, use_causal_mask=True)
model = keras.Model([xi, mi], h)
x = rnd(0, 3, 7, D); m = np.arange(7)[None] < np.array([4, 7, 5])[:, None]
want = keras.ops.convert_to_numpy(model([x, m]))
d = tempfile.mkdtemp(dir="/tmp/review_convert")
model.export(f"{d}/sm", format="tf_saved_model", verbose=False)
import tensorflow as tf
art = tf.saved_model.load(f"{d}/sm")
got = art.serve([x, m])
print(B, "converted model tf_saved_model diff", float(np.abs(np.asarray(got) - want).max()))
try:
    model.export(f"{d}/m.onnx", format="onnx", verbose=False)
    import onnxruntime as ort
    s = ort.InferenceSession(f"{d}/m.onnx")
    names = [i.name for i in s.get_inputs()]
    got = s.run(None, dict(zip(names, [x, m])))[0]
    print(B, "converted model onnx diff", float(np.abs(got - want).max()), names)
except Exception as e:
    print(B, "onnx ERROR", type(e).__name__, str(e)[:300])
