// SPDX-License-Identifier: Apache-2.0
// Policies are types; these checks are compile-time (static_assert) and one runtime test case
// reports that they held.
#include <catch2/catch_test_macros.hpp>

#include "pmt/policy/hybrid.hpp"
#include "pmt/policy/policy_traits.hpp"

#include <type_traits>

using namespace pmt;

static_assert(is_parallel_policy_v<Replicate> && is_parallel_policy_v<TensorSplit<Col>> &&
              is_parallel_policy_v<DataParallel<>> && is_parallel_policy_v<Pipeline<2>>);
static_assert(!is_parallel_policy_v<int> && !is_parallel_policy_v<Col>);
static_assert(policy_traits<TensorSplit<Col>>::axis == Axis::tp && policy_traits<DataParallel<>>::axis == Axis::dp &&
              policy_traits<Pipeline<>>::axis == Axis::pp);
static_assert(policy_traits<Pipeline<4>>::static_degree == 4 && policy_traits<Pipeline<>>::static_degree == dynamic);
static_assert(std::is_same_v<policy_traits<TensorSplit<Col>>::output_placement, Sharded> &&
              std::is_same_v<policy_traits<TensorSplit<Row>>::input_placement, Sharded> &&
              std::is_same_v<policy_traits<TensorSplit<Row>>::output_placement, Replicated>);
static_assert(policy_traits<TensorSplit<Col>>::layer_policy && !policy_traits<TensorSplit<Col>>::model_policy);
static_assert(!policy_traits<DataParallel<LocalSgd<4>>>::layer_policy && LocalSgd<4>::period == 4);

using A = Hybrid<DataParallel<>, TensorSplit<>, Pipeline<2>>;
using B = Hybrid<Pipeline<2>, DataParallel<>, TensorSplit<>>;
static_assert(std::is_same_v<A::get<Axis::dp>, B::get<Axis::dp>> &&
                  std::is_same_v<A::get<Axis::tp>, B::get<Axis::tp>> &&
                  std::is_same_v<A::get<Axis::pp>, B::get<Axis::pp>>,
              "Hybrid is order-independent");
static_assert(std::is_same_v<A::get<Axis::pp>, Pipeline<2>>);
using DpOnly = Hybrid<DataParallel<LocalSgd<8>>>;
static_assert(DpOnly::has(Axis::dp) && !DpOnly::has(Axis::tp) && std::is_same_v<DpOnly::get<Axis::tp>, Replicate>);

// Sequence parallelism and recomputation as policies: TensorSplit<Sequence> is the tp axis with
// sequence parallelism fixed; Recompute<What, Stages> is a model policy on no axis.
static_assert(policy_traits<TensorSplit<Sequence>>::model_policy &&
              !policy_traits<TensorSplit<Sequence>>::layer_policy &&
              policy_traits<TensorSplit<Sequence>>::axis == Axis::tp);
static_assert(policy_traits<Recompute<>>::model_policy && !policy_traits<Recompute<>>::has_axis &&
              !policy_traits<Recompute<Selective>>::layer_policy);
static_assert(Recompute<Full, 2>::on(0) && Recompute<Full, 2>::on(1) && !Recompute<Full, 2>::on(2) &&
              Recompute<>::on(7));
using Seq = Hybrid<Recompute<Selective, 1>, DataParallel<>, TensorSplit<Sequence>, Pipeline<>>;
static_assert(Seq::sequence_parallel && std::is_same_v<Seq::recompute, Recompute<Selective, 1>> &&
              std::is_same_v<Seq::get<Axis::tp>, TensorSplit<Sequence>> && Seq::has(Axis::pp));
static_assert(activation_policy<Seq>::sequence_parallel && activation_policy<Seq>::selective &&
              !activation_policy<Seq>::full && activation_policy<Seq>::recomputes_on(0) &&
              !activation_policy<Seq>::recomputes_on(1));
static_assert(!A::sequence_parallel && std::is_void_v<A::recompute> && !activation_policy<A>::fixes_recompute &&
              !activation_policy<A>::recomputes_on(0));
static_assert(!activation_policy<Synchronous>::sequence_parallel && !activation_policy<Synchronous>::fixes_recompute);
using FullOnly = Hybrid<Recompute<Full>>;
static_assert(activation_policy<FullOnly>::full && activation_policy<FullOnly>::recomputes_on(3) &&
              !FullOnly::has(Axis::tp));

TEST_CASE("policy traits and Hybrid hold at compile time", "[policy]") {
  SUCCEED("the static_asserts in this file compiled");
}
