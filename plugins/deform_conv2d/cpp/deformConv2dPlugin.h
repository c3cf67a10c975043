// DeformConv2d TensorRT plugin (IPluginV3: OneCore + OneBuild + OneRuntime) and its creator.
// Name "DeformConv2d", version "1", namespace "gskit" (plugins/deform_conv2d/spec.py); fields strides,
// pads, dilations, group, offset_group. Inputs (x, weight, offset[, bias[, mask]]), float or half.
#pragma once

#include "NvInferRuntime.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace gskit
{

class DeformConv2dPlugin : public nvinfer1::IPluginV3,
                           public nvinfer1::IPluginV3OneCore,
                           public nvinfer1::IPluginV3OneBuild,
                           public nvinfer1::IPluginV3OneRuntime
{
public:
    struct Attributes
    {
        std::array<int32_t, 2> strides{1, 1};
        std::array<int32_t, 4> pads{0, 0, 0, 0}; // top, left, bottom, right
        std::array<int32_t, 2> dilations{1, 1};
        int32_t group{1};
        int32_t offsetGroup{1};

        //! Empty when the values are usable, else why not (strides/dilations/groups > 0, pads >= 0).
        std::string check() const;
    };

    explicit DeformConv2dPlugin(Attributes const& attrs);
    ~DeformConv2dPlugin() override = default;
    // mFields points into this object's own mAttrs: a copy would point into the source object.
    DeformConv2dPlugin(DeformConv2dPlugin const&) = delete;
    DeformConv2dPlugin& operator=(DeformConv2dPlugin const&) = delete;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    //! Empty when the input/output dims fit together (unknown dims, -1, are not checked), else why not.
    std::string checkShapes(nvinfer1::Dims const* inputs, int32_t nbInputs, nvinfer1::Dims const* output) const;
    //! checkShapes on tensor descriptors of either kind; logs the mismatch. Defined in the .cpp (used there only).
    template <typename Desc>
    bool shapesFit(Desc const* inputs, int32_t nbInputs, Desc const& output) const;
    //! What configurePlugin and onShapeChange do: check counts and shapes, then keep the input count.
    template <typename Desc>
    int32_t acceptShapes(Desc const* inputs, int32_t nbInputs, Desc const* outputs, int32_t nbOutputs) noexcept;

    Attributes mAttrs;
    int32_t mNbInputs{3};
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

class DeformConv2dPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    DeformConv2dPluginCreator();
    ~DeformConv2dPluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    //! Unknown fields, fields of another type or length, and unusable values are rejected: nullptr and an error.
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace gskit

// Entry points that IPluginRegistry::loadLibrary() (trtexec --dynamicPlugins, setPluginsToSerialize, Python
// registry.load_library) looks up. Loading the library with dlopen / ctypes.CDLL also registers the creator
// with the global registry of an already-loaded libnvinfer (see deformConv2dPlugin.cpp).
extern "C" __attribute__((visibility("default"))) void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;
extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginCreatorInterface* const* getCreators(
    int32_t& nbCreators) noexcept;
