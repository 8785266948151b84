"""Sequences longer than one device holds: context parallelism.

`ContextParallel` is a `keras.distribution` distribution that shards the
data along the batch and along time. Under it, the library's attention
computes, on each device, the attention of its part of the queries to
the whole sequence, passing keys and values between devices (ring
attention, Liu et al. 2023) or gathering them, with every position
global and causal work balanced over the devices. Everything else in a
model (projections, norms, positions, the loss) runs on the sharded
tensors through XLA's partitioner, as with any Keras distribution.

JAX only: Keras distributions run on JAX's SPMD compiler.
"""

import keras
import numpy as np


class ContextParallel(keras.distribution.ModelParallel):
    """Data sharded along batch and time; attention across the devices.

    Data batches are split along their first dimension over the mesh's
    `batch_dim_name` axis and along their second (time) dimension over
    its `sequence_dim_name` axis (a tensor whose second dimension the
    sequence axis does not divide, such as one label per sequence, is
    split along the batch only). Variables follow `layout_map`, and are
    replicated where it says nothing, so a third mesh axis can carry
    tensor parallelism. Build, `fit` and call the model as on one
    device.

    Under it, `MultiHeadSelfAttention`, `CrossAttention`,
    `TransformerEncoderBlock`, `TransformerDecoderBlock` and
    `functional.scaled_dot_product_attention` keep each device's query
    shard and meet every key shard by a ring of `ppermute`s or an
    all-gather (`explain()` says which and why). Causal attention
    reorders the sequence into a zig-zag inside the call, so that every
    device has as much work; outputs come back in order. The query and
    key lengths must be multiples of twice the number of devices along
    the sequence axis, and the batch a multiple of the devices along the
    batch axis.

    Args:
        device_mesh (keras.distribution.DeviceMesh): Its axes include
            `batch_dim_name` and `sequence_dim_name`.
        layout_map (keras.distribution.LayoutMap | None): Variable
            layouts on `device_mesh`; `None` replicates every variable.
        batch_dim_name (str): The mesh axis of the batch.
        sequence_dim_name (str): The mesh axis of time.
        auto_shard_dataset (bool): As in `keras.distribution.ModelParallel`.

    Raises:
        ValueError: on a backend other than JAX, or for a mesh without
            the named axes, or a layout map on another mesh.

    Examples:
        >>> import keras
        >>> from keras_attention.distribution import ContextParallel
        >>> devices = keras.distribution.list_devices()
        >>> mesh = keras.distribution.DeviceMesh(
        ...     (1, len(devices)), ("batch", "sequence"), devices
        ... )
        >>> layout = ContextParallel(mesh).get_data_layout((4, 16, 8))
        >>> layout.axes  # tokens (B, T, D): B and T sharded
        ('batch', 'sequence', None)

    References:
        Liu et al., "Ring Attention with Blockwise Transformers for
        Near-Infinite Context", 2023. Brandon et al., "Striped
        Attention: Faster Ring Attention for Causal Transformers", 2023.
    """

    def __init__(
        self,
        device_mesh: keras.distribution.DeviceMesh,
        layout_map: keras.distribution.LayoutMap | None = None,
        batch_dim_name: str = "batch",
        sequence_dim_name: str = "sequence",
        auto_shard_dataset: bool = True,
    ):
        if keras.backend.backend() != "jax":
            raise ValueError(
                "ContextParallel: needs the JAX backend (Keras distributions "
                "run on JAX's SPMD compiler). Received: KERAS_BACKEND="
                f"{keras.backend.backend()!r}"
            )
        if not isinstance(device_mesh, keras.distribution.DeviceMesh):
            raise ValueError(
                "ContextParallel: `device_mesh` must be a "
                "keras.distribution.DeviceMesh. Received: "
                f"device_mesh={device_mesh!r}"
            )
        names = tuple(device_mesh.axis_names)
        for argument, name in (
            ("batch_dim_name", batch_dim_name),
            ("sequence_dim_name", sequence_dim_name),
        ):
            if name not in names:
                raise ValueError(
                    f"ContextParallel: `{argument}` must name an axis of "
                    f"the device mesh, one of {names}. Received: "
                    f"{argument}={name!r}"
                )
        if batch_dim_name == sequence_dim_name:
            raise ValueError(
                "ContextParallel: `batch_dim_name` and `sequence_dim_name` "
                f"must differ. Received: both {batch_dim_name!r}"
            )
        if layout_map is None:
            layout_map = keras.distribution.LayoutMap(device_mesh)
        elif not isinstance(layout_map, keras.distribution.LayoutMap):
            raise ValueError(
                "ContextParallel: `layout_map` must be a "
                "keras.distribution.LayoutMap on `device_mesh`, or None. "
                f"Received: layout_map={layout_map!r}"
            )
        elif _mesh(layout_map.device_mesh) != _mesh(device_mesh):
            raise ValueError(
                "ContextParallel: `layout_map` must be on `device_mesh` "
                f"(shape, axes, devices: {_mesh(device_mesh)}). Received: "
                f"layout_map on {_mesh(layout_map.device_mesh)}"
            )
        super().__init__(
            layout_map=layout_map,
            batch_dim_name=batch_dim_name,
            auto_shard_dataset=auto_shard_dataset,
        )
        self.sequence_dim_name = sequence_dim_name

    @property
    def sequence_devices(self) -> int:
        """Devices along the sequence axis."""
        axis = self.device_mesh.axis_names.index(self.sequence_dim_name)
        return self.device_mesh.shape[axis]

    def get_data_layout(self, data_shape):
        """The batch over the batch axis; time over the sequence axis
        where the sequence axis divides it."""
        axes = [None] * len(data_shape)
        axes[0] = self.batch_dim_name
        if (
            len(data_shape) >= 2
            and isinstance(data_shape[1], int)
            and data_shape[1] % self.sequence_devices == 0
        ):
            axes[1] = self.sequence_dim_name
        return keras.distribution.TensorLayout(axes, self.device_mesh)


def _mesh(device_mesh):
    """What makes two device meshes the same mesh: shape, axis names and
    devices."""
    return (
        tuple(device_mesh.shape),
        tuple(device_mesh.axis_names),
        tuple(str(d) for d in np.ravel(device_mesh.devices)),
    )
